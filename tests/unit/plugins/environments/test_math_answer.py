"""Answer extraction, exact numeric comparison, and the check of worked equations."""

import pytest

from realhf.plugins.environments.math_answer import extract_answer, numbers_equal, parse_number, work_lines_correct


@pytest.mark.parametrize(
    "text, answer",
    [
        ("so \\boxed{\\frac{1}{\\sqrt{2}}} done", "\\frac{1}{\\sqrt{2}}"),  # nested braces
        ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
        ("first \\boxed{1} then \\boxed{2}", "2"),  # the last box
        ("\\boxed {7}", "7"),
        ("\\boxed{unclosed and #### 4", "4"),  # unbalanced box: fall through
        ("#### 12 and \\boxed{3}", "3"),  # a box beats ####
        (" 5-2=3\n#### 3", "3"),
        (" 5-2=3\n#### 3\n#### 4", "3"),  # the first ####
        ("####  42.\n", "42"),
        ("#### \nthe total is 5", "5"),  # empty #### line: last number
        ("5-2 is 3, then 3+4=7", "7"),
        ("x = 5-2", "2"),  # a minus between digits is not a sign
        ("it is -4 degrees", "-4"),
        ("pay 12,345 dollars", "12,345"),
        ("half is 1/2", "1/2"),
        ("pi is 3.14", "3.14"),
        ("no answer here", None),
        ("", None),
    ],
)
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("3", "3.0", True),
        ("3", "03", True),
        ("3.50", "3.5", True),
        ("1/2", "0.5", True),
        ("-2", "-2.0", True),
        ("1,000", "1000", True),
        ("$3$", "3", True),
        ("3", "4", False),
        ("0.5", "0.50001", False),
        ("-3", "3", False),
        ("x", "3", None),
        ("\\frac{1}{2}", "0.5", None),
        ("1/0", "1", None),
        ("3 apples", "3", None),
    ],
)
def test_numbers_equal_is_exact(a, b, same):
    assert numbers_equal(a, b) is same


def test_parse_number_is_exact_not_float():
    assert parse_number("0.1") * 3 == parse_number("0.3")


@pytest.mark.parametrize(
    "text, ok",
    [
        (" 5-2=3\n3+4=7", True),
        (" 4-4=1", False),
        ("12 + 9 = 21", True),
        ("2*3=7", False),
        ("1.5+2=3.5", True),
        ("#### 3", True),
        ("9-12=-3", True),
    ],
)
def test_work_lines_correct_checks_integer_equations_only(text, ok):
    assert work_lines_correct(text) is ok
