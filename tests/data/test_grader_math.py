"""Answer extraction, exact numeric comparison, and math-verify equivalence through the pool."""

import asyncio

import pytest

from realhf.impl.environment.math_answer import extract_answer, numbers_equal, parse_number
from realhf.impl.environment.math_grader import MathGrader


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


@pytest.fixture(scope="module")
def grader():
    with MathGrader(n_workers=1, timeout=20.0) as g:
        yield g


@pytest.mark.parametrize(
    "text, solutions, correct",
    [
        (" 5-2=3\n#### 3", [" 5-2=3\n#### 3"], True),
        (" 5-2=4\n#### 4", [" 5-2=3\n#### 3"], False),
        (" 9+9=18\n#### 18", [" 9+9=18\n#### 18"], True),
        ("#### 18", ["#### 1"], False),  # not a prefix match
        ("#### 03", ["#### 3.0"], True),
        ("#### 0.5", ["#### 1/2"], True),
        ("no final answer", ["#### 3"], False),
        ("#### 7", ["#### 3", "#### 7"], True),  # any reference solution
        ("#### 2", ["2"], True),  # a bare answer as the reference
    ],
)
def test_plain_number_answers_never_touch_the_pool(text, solutions, correct):
    with MathGrader(verify_target="no_such_module:never_called") as g:
        assert g.grade(text, solutions) is correct
        assert g.pool.n_started == 0


@pytest.mark.parametrize(
    "text, solutions, correct",
    [
        ("\\boxed{\\frac{1}{2}}", ["#### 0.5"], True),
        ("\\boxed{\\frac{2}{4}}", ["\\boxed{\\frac{1}{2}}"], True),
        ("\\boxed{x^2+1}", ["\\boxed{1+x^2}"], True),
        ("\\boxed{x^2+2}", ["\\boxed{1+x^2}"], False),
        ("\\boxed{1}", ["\\boxed{1+x^2}"], False),
        ("\\boxed{\\sqrt{4}}", ["#### 2"], True),
        ("\\boxed{\\sqrt{5}}", ["#### 2"], False),
    ],
)
def test_symbolic_answers_are_checked_by_math_verify(grader, text, solutions, correct):
    assert grader.grade(text, solutions) is correct


def test_agrade_agrees_with_grade(grader):
    cases = [("\\boxed{\\frac{1}{2}}", ["#### 0.5"]), ("#### 3", ["#### 3"]), ("#### 4", ["#### 3"])]

    async def run_all():
        return await asyncio.gather(*(grader.agrade(t, s) for t, s in cases))

    assert asyncio.run(run_all()) == [True, True, False]
