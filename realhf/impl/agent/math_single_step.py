"""The `math-single-step` agent: one prompt, `group_size` answers, one reward each.

    reward = ((success − 0.5)·2 − reward_bias)·reward_scaling        (AReaL's ±1 success reward)

A group whose success rate is strictly below `success_rate_lb` or strictly above
`success_rate_ub` is dropped (returns None): all-right or all-wrong groups carry no GRPO signal.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from realhf.api.agent import Agent, Prompt, keep_group, register_agent, success_reward
from realhf.api.trajectory import Sample, Trajectory


def decode(tokenizer: Any, ids) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True)


@register_agent("math-single-step")
class MathSingleStepAgent(Agent):
    async def collect_trajectory(self, prompt: Prompt, env: Any, client: Any) -> Optional[Trajectory]:
        birth = time.time()
        await env.reset(prompt)
        results = await client.generate_group(prompt.qid, prompt.prompt_ids, self.gconfig, self.group_size)
        answers = [decode(self.tokenizer, r.output_ids) for r in results]
        _, successes, _, _ = await env.step((prompt, answers))
        cfg = self.config
        success_rate = sum(successes) / len(successes)
        if not keep_group(successes, cfg.success_rate_lb, cfg.success_rate_ub):
            return None
        samples = [
            Sample(output_ids=r.output_ids, logprobs=r.logprobs, versions=r.versions,
                   reward=success_reward(s, cfg.reward_bias, cfg.reward_scaling), no_eos=r.no_eos)
            for r, s in zip(results, successes)
        ]
        return Trajectory(qid=prompt.qid, prompt_ids=list(prompt.prompt_ids), samples=samples, task=prompt.task,
                          birth_time=birth,
                          metadata={"query_id": prompt.query_id, "success_rate": success_rate,
                                    "n_requests": sum(r.n_requests for r in results)})
