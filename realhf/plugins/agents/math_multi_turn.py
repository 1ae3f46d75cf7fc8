"""The `math-multi-turn` agent: after a wrong answer, a feedback turn and another try.

An episode is up to `num_turns` attempts, concatenated at the token level:

    prompt │ answer₁ │ feedback │ answer₂ │ feedback │ … │ answerₖ

The feedback tokens are appended by the agent, not sampled: no loss, log-prob 0, the version of
the answer before them. The reward is ±1 for the last attempt times `turn_level_discount^(k−1)`;
success (for the group filter) is whether the last attempt was right.
"""

from __future__ import annotations

from typing import Any, Dict

from realhf.api.agent import Agent, EpisodeResult, register_agent
from realhf.plugins.agents.math_single_step import graded


@register_agent("math-multi-turn")
class MathMultiTurnAgent(Agent):
    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        cfg = self.config
        turn = 0
        for turn in range(cfg.num_turns):
            answer = await gen()
            _, env_reward, _, _ = await env.step(answer.text)
            outcome = graded(env_reward)
            if outcome.succeeded or turn == cfg.num_turns - 1:
                break
            gen.append(cfg.feedback)
        outcome.reward *= cfg.turn_level_discount**turn
        outcome.info["turns"] = turn + 1
        return outcome
