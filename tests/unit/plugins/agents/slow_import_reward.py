"""A reward function whose module takes 2.5 s of CPU to import (as one importing torch or a
verifier does on a busy machine), for tests/unit/plugins/agents/test_reward_processes.py."""

import time

_end = time.process_time() + 2.5
while time.process_time() < _end:  # CPU, not sleep: a demoted, throttled import would crawl
    pass


def fine(prompt, completion, **row):
    return 1.0
