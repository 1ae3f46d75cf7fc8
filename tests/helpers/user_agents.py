"""What a user writes: a reward function over the row's fields (`rollout.agent.reward_fn=
helpers.user_agents:answer_matches`), an agent written against the openai client, and a task of
its own that is not math (`ParityAgent`, `ParityEnv`, rows from `parity_rows`), checked by the tests."""

import json
import re

from realhf.api.agent import Agent, Outcome
from realhf.api.env import Environment


def answer_matches(prompt: str, completion: str, solutions, **row) -> bool:
    """Right when the completion's `#### N` equals the reference's."""
    got = re.search(r"####\s*(-?\d+)", completion)
    want = re.search(r"####\s*(-?\d+)", solutions[0])
    return bool(got and want and got.group(1) == want.group(1))


async def openai_math(client, row) -> float:
    """An agent written against the openai client: one question, graded by its `#### N`."""
    reply = await client.chat.completions.create(model="realhf", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0 if answer_matches(row["prompt"], reply.choices[0].message.content or "", row["solutions"]) else -1.0


# ---- a task that is not math: its own agent, environment and data (no `solutions`) ------------


def parity_rows(jsonl_path: str, n: int) -> list:
    """The first n prompts of a tiny-math file as a user's non-math task: the row asks for an
    answer whose final number is even (`want`), and carries no reference answer."""
    rows = []
    with open(jsonl_path) as f:
        for line in f:
            row = json.loads(line)
            rows.append({"query_id": row["query_id"], "prompt": row["prompt"], "want": "even"})
            if len(rows) == n:
                break
    return rows


def final_number(text: str):
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class ParityEnv(Environment):
    """Success when the answer's last number has the row's parity; the math grader would grade
    the same answers against a reference, which these rows do not have."""

    required_fields = ("want",)

    async def step(self, action):
        number = final_number(action)
        right = number is not None and (number % 2 == 0) == (self.row["want"] == "even")
        return None, 1.0 if right else 0.0, True, {"digits": len(str(abs(number))) if number is not None else 0}


class ParityAgent(Agent):
    """One answer; reward +2 for a success and -0.5 otherwise (not the math agents' ±1), and the
    number of digits of the final number as an agent metric."""

    async def run_episode(self, row, gen, env):
        answer = await gen()
        _, reward, _, info = await env.step(answer.text)
        return Outcome(2.0 if reward > 0 else -0.5, success=reward > 0, info={"digits": info["digits"]})
