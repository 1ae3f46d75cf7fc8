"""A custom agent and environment for realhf: a second try after a wrong answer.

    bash examples/run_async_ppo.sh rollout.agent.type=examples.custom_agent.agent:RetryAgent \
        rollout.env.type=examples.custom_agent.agent:ExactAnswerEnv
"""

import re

from realhf.api.agent import Agent, Outcome
from realhf.api.env import Environment


def final_number(text):
    found = re.search(r"####\s*(-?\d+)", text)
    return found.group(1) if found else None


class ExactAnswerEnv(Environment):
    """One per episode: reward 1 when the answer after '####' is the reference's; two tries."""

    required_fields = ("solutions",)  # checked in every dataset row before the run starts

    async def reset(self):
        self.tries, self.want = 0, final_number(self.row["solutions"][0])

    async def step(self, answer):
        self.tries += 1
        right = final_number(answer) == self.want
        return None, float(right), right or self.tries == 2, {}


class RetryAgent(Agent):
    """+1 when right at once, +0.5 when right at the second try, -1 otherwise."""

    async def run_episode(self, row, gen, env):
        for attempt in range(2):
            answer = await gen()  # continues from the prompt and everything so far
            _, reward, done, _ = await env.step(answer.text)
            if reward > 0:
                return Outcome(1.0 if attempt == 0 else 0.5, success=True)
            if done:
                return -1.0
            gen.append("\nWrong. Try again.\nA:")  # not generated: no loss
