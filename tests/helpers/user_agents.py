"""What a user writes: a reward function over the row's fields (`rollout.agent.reward_fn=
helpers.user_agents:answer_matches`), checked by the system tests."""

import re


def answer_matches(prompt: str, completion: str, solutions, **row) -> bool:
    """Right when the completion's `#### N` equals the reference's."""
    got = re.search(r"####\s*(-?\d+)", completion)
    want = re.search(r"####\s*(-?\d+)", solutions[0])
    return bool(got and want and got.group(1) == want.group(1))
