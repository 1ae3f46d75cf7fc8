"""The math grader: plain numbers compared exactly in process, math-verify equivalence through the pool."""

import asyncio

import pytest

from realhf.plugins.environments.math_grader import MathGrader


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


@pytest.mark.system
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


@pytest.mark.system
def test_agrade_agrees_with_grade(grader):
    cases = [("\\boxed{\\frac{1}{2}}", ["#### 0.5"]), ("#### 3", ["#### 3"]), ("#### 4", ["#### 3"])]

    async def run_all():
        return await asyncio.gather(*(grader.agrade(t, s) for t, s in cases))

    assert asyncio.run(run_all()) == [True, True, False]
