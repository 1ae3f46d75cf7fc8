"""What a user writes: a reward function over the row's fields (`rollout.agent.reward_fn=
helpers.user_agents:answer_matches`), checked by the system tests."""

import re


def answer_matches(prompt: str, completion: str, solutions, **row) -> bool:
    """Right when the completion's `#### N` equals the reference's."""
    got = re.search(r"####\s*(-?\d+)", completion)
    want = re.search(r"####\s*(-?\d+)", solutions[0])
    return bool(got and want and got.group(1) == want.group(1))


async def openai_math(client, row) -> float:
    """An agent written against the openai client: one question, graded by its `#### N`."""
    reply = await client.chat.completions.create(model="realhf", messages=[{"role": "user", "content": row["prompt"]}])
    return 1.0 if answer_matches(row["prompt"], reply.choices[0].message.content or "", row["solutions"]) else -1.0
