"""The built-in `math` environment: which answers it reads and, with check_work, the worked equations."""

import asyncio

import pytest

from realhf.api.cli_args import EnvConfig
from realhf.api.env import EnvFactory


def grade(answers, solutions, **env):
    """Each answer graded by a fresh episode environment of one factory (one shared grader)."""

    async def main():
        envs = EnvFactory(EnvConfig(**env))
        try:
            out = []
            for answer in answers:
                e = await envs.make({"query_id": "q", "prompt": "", "solutions": solutions})
                try:
                    out.append(await e.step(answer))
                finally:
                    await e.aclose()
            return out
        finally:
            await envs.aclose()

    return asyncio.run(main())


def test_math_env_reads_boxed_hash_and_last_number_answers():
    steps = grade(["\\boxed{7}", "#### 7", "so it is 7", "#### 8", ""], [" 3+4=7\n#### 7"])
    assert [r for _, r, _, _ in steps] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert [done for _, _, done, _ in steps] == [True, True, True, False, False]  # done once right
    assert [info["extracted"] for *_, info in steps] == ["7", "7", "7", "8", None]


@pytest.mark.parametrize("check_work, expected", [(False, [1.0, 1.0, 0.0, 1.0]), (True, [1.0, 0.0, 0.0, 1.0])])
def test_math_env_check_work_also_requires_every_worked_equation_to_hold(check_work, expected):
    answers = [
        " 4-2=2\n2+5=7\n#### 7",  # right steps, right answer
        " 4-2=3\n2+5=7\n#### 7",  # a wrong step, right answer by luck
        " 4-2=2\n2+5=8\n#### 8",  # wrong answer
        "#### 7",
    ]  # no worked lines: nothing to check
    steps = grade(answers, [" 4-2=2\n2+5=7\n#### 7"], check_work=check_work)
    assert [r for _, r, _, _ in steps] == expected
    assert [i["answer_right"] for *_, i in steps] == [True, True, False, True]
    assert [i["work_right"] for *_, i in steps] == [True, False, False, True]


def test_a_non_text_action_is_refused_naming_what_was_given():
    with pytest.raises(ValueError, match="an action is the answer text, got list"):
        grade([["7"]], ["#### 7"])
