"""The built-in `math` environment: which answers it reads and, with check_work, the worked equations."""

import asyncio

import pytest

from realhf.api.agent import Prompt
from realhf.api.cli_args import EnvConfig
from realhf.api.env import make_env


def test_math_env_reads_boxed_hash_and_last_number_answers():
    async def main():
        env = make_env(EnvConfig())
        try:
            p = Prompt(query_id="q", prompt="", solutions=(" 3+4=7\n#### 7",), task="math", qid="q")
            _, successes, done, info = await env.step((p, ["\\boxed{7}", "#### 7", "so it is 7", "#### 8", ""]))
            return successes, done, info
        finally:
            await env.aclose()

    successes, done, info = asyncio.run(main())
    assert successes == [1.0, 1.0, 1.0, 0.0, 0.0] and done
    assert info["extracted"] == ["7", "7", "7", "8", None]


@pytest.mark.parametrize("check_work, expected", [(False, [1.0, 1.0, 0.0, 1.0]), (True, [1.0, 0.0, 0.0, 1.0])])
def test_math_env_check_work_also_requires_every_worked_equation_to_hold(check_work, expected):
    answers = [" 4-2=2\n2+5=7\n#### 7",  # right steps, right answer
               " 4-2=3\n2+5=7\n#### 7",  # a wrong step, right answer by luck
               " 4-2=2\n2+5=8\n#### 8",  # wrong answer
               "#### 7"]                 # no worked lines: nothing to check
    async def main():
        env = make_env(EnvConfig(check_work=check_work))
        try:
            return await env.step((Prompt(query_id="q", prompt="", solutions=(" 4-2=2\n2+5=7\n#### 7",), task="math", qid="q"), answers))
        finally:
            await env.aclose()

    _, successes, _, info = asyncio.run(main())
    assert successes == expected
    assert info["answer_right"] == [True, True, False, True] and info["work_right"] == [True, False, False, True]
