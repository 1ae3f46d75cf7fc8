"""The `math-multi-turn` agent: after a wrong answer, a feedback turn and another try.

Each of the `group_size` samples is an episode of up to `num_turns` attempts:

    prompt │ answer₁ │ feedback │ answer₂ │ feedback │ … │ answerₖ

All of it after the prompt is the sample's `output_ids`; the feedback tokens, inserted by the
agent rather than sampled, have `loss_mask` 0, behaviour log-prob 0 and the version of the answer
before them. The reward is the success reward of the last attempt times
`turn_level_discount^(attempts − 1)`; the group filter uses the final successes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, List, Optional, Tuple

from realhf.api.agent import Agent, Prompt, keep_group, register_agent, success_reward
from realhf.api.trajectory import Sample, Trajectory
from realhf.impl.agent.math_single_step import decode


@register_agent("math-multi-turn")
class MathMultiTurnAgent(Agent):
    def _feedback_ids(self) -> List[int]:
        return list(self.tokenizer(self.config.feedback, add_special_tokens=False)["input_ids"])

    async def _episode(self, prompt: Prompt, env: Any, client: Any) -> Tuple[Sample, float, int]:
        cfg = self.config
        ids: List[int] = []
        logprobs: List[float] = []
        versions: List[int] = []
        mask: List[int] = []
        success, no_eos, turn = 0.0, False, 0
        for turn in range(cfg.num_turns):
            r = await client.generate(prompt.qid, list(prompt.prompt_ids) + ids, self.gconfig, self.group_size)
            ids += r.output_ids
            logprobs += r.logprobs
            versions += r.versions
            mask += [1] * len(r.output_ids)
            no_eos = r.no_eos
            _, (success,), _, _ = await env.step((prompt, [decode(self.tokenizer, r.output_ids)]))
            if success or turn == cfg.num_turns - 1:
                break
            feedback = self._feedback_ids()
            last_version = versions[-1] if versions else 0
            ids += feedback
            logprobs += [0.0] * len(feedback)
            versions += [last_version] * len(feedback)
            mask += [0] * len(feedback)
        reward = success_reward(success, cfg.reward_bias, cfg.reward_scaling) * cfg.turn_level_discount ** turn
        return Sample(ids, logprobs, versions, reward, no_eos, mask), success, turn + 1

    async def collect_trajectory(self, prompt: Prompt, env: Any, client: Any) -> Optional[Trajectory]:
        birth = time.time()
        await env.reset(prompt)
        episodes = await asyncio.gather(*(self._episode(prompt, env, client) for _ in range(self.group_size)))
        successes = [s for _, s, _ in episodes]
        if not keep_group(successes, self.config.success_rate_lb, self.config.success_rate_ub):
            return None
        return Trajectory(
            qid=prompt.qid, prompt_ids=list(prompt.prompt_ids), samples=[e for e, _, _ in episodes],
            task=prompt.task, birth_time=birth,
            metadata={"query_id": prompt.query_id, "success_rate": sum(successes) / len(successes),
                      "turns": [t for _, _, t in episodes]},
        )
