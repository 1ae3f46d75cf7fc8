"""Reward functions for `scripts/bench/reward_isolation.py`: the embedded task's grading, and the
same with a call that never returns on some prompts (chosen by a hash of the query id, so every
sample of such a prompt hangs, as a real pathological input would)."""

import re
import time
import zlib


def _right(completion: str, solutions) -> bool:
    got = re.search(r"####\s*(-?\d+)", completion)
    want = re.search(r"####\s*(-?\d+)", solutions[0])
    return bool(got and want and got.group(1) == want.group(1))


def _share(query_id: str) -> float:
    """A number in [0, 1) fixed per prompt."""
    return (zlib.crc32(query_id.encode()) % 1000) / 1000


def grade(prompt, completion, *, solutions, **row):
    return _right(completion, solutions)


def spins_on_3_percent(prompt, completion, *, query_id, solutions, **row):
    if _share(query_id) < 0.03:
        while True:
            pass
    return _right(completion, solutions)


def sleeps_on_30_percent(prompt, completion, *, query_id, solutions, **row):
    if _share(query_id) < 0.30:
        time.sleep(3600)
    return _right(completion, solutions)


def sleeps_on_3_percent(prompt, completion, *, query_id, solutions, **row):
    """As spins_on_3_percent without the CPU: what the stuck groups cost by themselves."""
    if _share(query_id) < 0.03:
        time.sleep(3600)
    return _right(completion, solutions)
