"""User plug-ins that misbehave on purpose (issue 14, items 3-5; issue 27, item 1), named in a
run's config as `rollout.env.type=helpers.faulty_plugins:NanRewardEnv` etc.

Which prompts misbehave is a function of the prompt's query_id (crc32), so every process and
every incarnation of a worker agrees, and a test can recompute it."""

from __future__ import annotations

import asyncio
import math
import os
import time
import zlib

from helpers.user_agents import answer_matches
from realhf.plugins.agents.math_single_step import MathSingleStepAgent
from realhf.plugins.environments.math_env import MathEnv


def bucket(query_id: str, n: int) -> int:
    return zlib.crc32(str(query_id).encode()) % n


class NanRewardEnv(MathEnv):
    """Grades like `math`, but a third of the prompts (bucket 0 of 3) get a NaN reward for every
    answer of their group."""

    async def step(self, action):
        obs, reward, done, info = await super().step(action)
        if bucket(self.row["query_id"], 3) == 0:
            reward = math.nan
        return obs, reward, done, info


class HangingEnv(MathEnv):
    """Grades like `math`, but its step never returns for a quarter of the prompts (bucket 0 of 4)."""

    async def step(self, action):
        if bucket(self.row["query_id"], 4) == 0:
            await asyncio.Event().wait()  # forever, until the episode is cancelled
        return await super().step(action)


class FatalAgentError(BaseException):
    """Not an Exception: an episode does not catch it, so it ends the rollout worker."""


class FatalOnceAgent(MathSingleStepAgent):
    """`math-single-step`, except that its `fail_at`-th episode (counted per process) raises
    FatalAgentError once per trial: `marker` (agent.args) is created first, so a restarted
    worker runs normally."""

    def __init__(self, config=None, *, marker: str = "", fail_at: int = 6, **kwargs):
        super().__init__(config, **kwargs)
        self.marker, self.fail_at, self.n = marker, int(fail_at), 0

    async def run_episode(self, row, gen, env):
        self.n += 1
        if self.n == self.fail_at and self.marker and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise FatalAgentError(f"FatalOnceAgent: fatal error in episode of {row['query_id']} (on purpose)")
        return await super().run_episode(row, gen, env)


class RaisingAgent(MathSingleStepAgent):
    """`math-single-step`, except that it raises for a third of the prompts (bucket 1 of 3, so
    beside NanRewardEnv's bucket 0 the two faults hit different prompts)."""

    async def run_episode(self, row, gen, env):
        await gen()  # fail mid-episode, after generating
        if bucket(row["query_id"], 3) == 1:
            raise ValueError(f"RaisingAgent: no answer for {row['query_id']} (on purpose)")
        return await super().run_episode(row, gen, env)


def blocking_reward(prompt, completion, *, query_id, solutions, **row):
    """A synchronous reward function (`rollout.agent.reward_fn=helpers.faulty_plugins:blocking_reward`)
    that blocks for an hour on a third of the prompts (bucket 2 of 3) — a stuck HTTP call, a lock
    never released — and otherwise grades like `helpers.user_agents:answer_matches`."""
    if bucket(query_id, 3) == 2:
        time.sleep(3600)
    return answer_matches(prompt, completion, solutions)


def spinning_reward(prompt, completion, *, query_id, solutions, **row):
    """A synchronous reward function that spins the CPU forever on about 3% of the prompts
    (bucket 0 of 32: a regex gone exponential, a loop that never ends) and otherwise grades like
    `helpers.user_agents:answer_matches` (issue 49: such a call is killed, not left running)."""
    if bucket(query_id, 32) == 0:
        while True:
            pass
    return answer_matches(prompt, completion, solutions)


def sleeping_reward(prompt, completion, *, query_id, solutions, **row):
    """Sleeps forever on about 30% of the prompts (buckets 0-2 of 10), else grades."""
    if bucket(query_id, 10) < 3:
        time.sleep(3600)
    return answer_matches(prompt, completion, solutions)


class MissingFieldAgent(MathSingleStepAgent):
    """`math-single-step` written for rows with a `tgt` field the embedded data does not have: every
    episode raises the same KeyError at the same line (a deterministic error in user code)."""

    async def run_episode(self, row, gen, env):
        target = row["tgt"]  # the embedded rows call it "solutions"
        return await super().run_episode(dict(row, solutions=[target]), gen, env)


def constant_reward(prompt, completion, **row):
    """A reward function that says the same of every answer (`rollout.agent.reward_fn=
    helpers.faulty_plugins:constant_reward`): every group has no spread, nothing can be learnt."""
    return -0.5
