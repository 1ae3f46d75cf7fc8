"""Reward functions for tests/unit/plugins/agents/test_reward_processes.py, imported by file path
in the reward processes (which do not have the tests' import path)."""

import os
import time


def spins_on_some(prompt, completion, **row):
    """Spins the CPU forever on prompts whose query_id ends in 'spin'; else +1 for '7'."""
    if row.get("query_id", "").endswith("spin"):
        while True:
            pass
    return completion.strip() == "7"


def sleeps_on_some(prompt, completion, **row):
    if row.get("query_id", "").endswith("sleep"):
        time.sleep(600)
    return 0.5


def numpy_scalar(prompt, completion, **row):
    import numpy as np

    return np.float32(0.25)


def outcome(prompt, completion, **row):
    from realhf.api.agent import Outcome

    return Outcome(0.75, success=True, info={"pid": os.getpid()})


def raises(prompt, completion, **row):
    return row["no_such_field"]


def a_string(prompt, completion, **row):
    return "right"
