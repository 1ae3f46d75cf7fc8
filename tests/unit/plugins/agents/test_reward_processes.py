"""Reward functions in processes that can be killed (issue 49, item 3): a call past the timeout is
killed, not abandoned — its CPU freed, the next call served by a fresh process — and what crosses
(rewards, Outcomes, errors with where they were raised) arrives as the function meant it."""

import asyncio
import os
import time

import psutil
import pytest

from realhf.api.agent import Outcome
from realhf.api.cli_args import AgentConfig
from realhf.plugins.agents.math_single_step import MathSingleStepAgent, RewardTimeout
from realhf.plugins.agents.reward_processes import RewardCallFailed, RewardProcesses

pytestmark = pytest.mark.system  # starts processes

FNS = os.path.join(os.path.dirname(__file__), "reward_fns.py")


class _Answer:
    def __init__(self, text):
        self.text = text


def _episode(agent, qid, text=" 7"):
    async def gen():
        return _Answer(text)

    return agent.run_episode({"query_id": qid, "prompt": "Q: 5+2?"}, gen, None)


def test_a_spinning_call_is_killed_at_the_timeout_and_the_next_is_served_by_a_fresh_process():
    agent = MathSingleStepAgent(AgentConfig(reward_fn=f"{FNS}:spins_on_some", reward_timeout=3.0))
    assert agent._processes is not None and agent._threads is None  # processes by default

    async def main():
        assert await _episode(agent, "q-1") is True
        [pid] = agent._processes.pool.worker_pids()
        proc = psutil.Process(pid)
        assert proc.nice() == 10
        # What the process used before this call (its start, the import of the user's function and
        # the first call: 0.02-0.05 s) is not the spinning call's.
        cpu0 = sum(proc.cpu_times()[:2])
        t0 = time.monotonic()
        spin = asyncio.ensure_future(_episode(agent, "q-2-spin"))
        await asyncio.sleep(2.7)
        # 1 s at full speed (at most), then demoted: the idle class, and running a tenth of the time
        # (1.2 CPU-s in the 2.7 s on an idle host; unthrottled it would be 2.7). The slack is for
        # the throttle's own timing on a loaded host (CI once measured 1.32 with the 0.05 above in it).
        cpu = sum(proc.cpu_times()[:2]) - cpu0
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE and cpu < 1.0 + 0.5, cpu
        with pytest.raises(RewardTimeout) as e:
            await spin
        took = time.monotonic() - t0
        assert not psutil.pid_exists(pid) or proc.status() == psutil.STATUS_ZOMBIE
        return e.value, took, await _episode(agent, "q-3", " 8")

    error, took, after = asyncio.run(main())
    assert 3.0 <= took < 7.0, took
    assert f"rollout.agent.reward_fn={FNS}:spins_on_some" in str(error) and "its process was killed" in str(error)
    assert "'q-2-spin'" in str(error) and not isinstance(error, TimeoutError)
    assert after is False and agent._processes.n_timeouts == 1
    agent._processes.close()


def test_calls_that_sleep_forever_end_at_the_timeout_and_the_others_go_on_beside_them():
    # 2 processes, 6 calls of which 2 never return: each of those holds a process only until its
    # timeout; the others are all graded.
    processes = RewardProcesses(f"{FNS}:sleeps_on_some", n=2, nice=0)
    agent = MathSingleStepAgent(AgentConfig(reward_fn=f"{FNS}:sleeps_on_some", reward_timeout=1.0))
    agent._processes.close()
    agent._processes = processes

    async def main():
        qids = ["a-sleep", "b", "c-sleep", "d", "e", "f"]
        return await asyncio.gather(*(_episode(agent, q) for q in qids), return_exceptions=True)

    t0 = time.monotonic()
    results = asyncio.run(main())
    assert [type(r).__name__ for r in results] == ["RewardTimeout", "float", "RewardTimeout", "float", "float", "float"]
    assert time.monotonic() - t0 < 10 and processes.n_timeouts == 2
    processes.close()


def test_what_crosses_arrives_as_meant_and_errors_name_where_they_were_raised():
    async def call(fn, row=None):
        p = RewardProcesses(f"{FNS}:{fn}", n=1, nice=0)
        try:
            return await p.call("Q", " 7", row or {"query_id": "q"}, timeout=30)
        finally:
            p.close()

    assert asyncio.run(call("numpy_scalar")) == 0.25
    out = asyncio.run(call("outcome"))
    assert isinstance(out, Outcome) and out.reward == 0.75 and out.success is True and out.info["pid"] != os.getpid()
    with pytest.raises(RewardCallFailed, match=r"raised KeyError: 'no_such_field' at .*reward_fns.py:\d+ in raises"):
        asyncio.run(call("raises"))
    with pytest.raises(RewardCallFailed, match="returned a str"):
        asyncio.run(call("a_string"))
    with pytest.raises(RewardCallFailed, match="reward_isolation=thread"):
        asyncio.run(call("numpy_scalar", {"query_id": "q", "blob": object()}))
    with pytest.raises(RewardCallFailed, match="no_such_function"):
        asyncio.run(call("no_such_function"))


def test_a_cancelled_episode_kills_its_calls_process_at_once():
    # A group fails when one of its samples' calls times out: the others are cancelled, and
    # their processes must not spin on until their own timeouts.
    agent = MathSingleStepAgent(AgentConfig(reward_fn=f"{FNS}:spins_on_some", reward_timeout=60))

    async def main():
        task = asyncio.ensure_future(_episode(agent, "q-spin"))
        while not agent._processes.pool.worker_pids():
            await asyncio.sleep(0.01)
        [pid] = agent._processes.pool.worker_pids()
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid, time.monotonic() - t0

    pid, took = asyncio.run(main())
    assert took < 2 and (not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    assert agent._processes.pool.worker_pids() == []
    agent._processes.close()


def test_a_prompt_is_probed_by_one_call_so_a_stuck_one_holds_one_process_not_one_per_sample():
    from realhf.system.rollout.episode import gather_or_cancel

    agent = MathSingleStepAgent(AgentConfig(reward_fn=f"{FNS}:spins_on_some", reward_timeout=1.0))

    async def group(qid):  # as a rollout worker runs a group: one failure cancels the others
        return await gather_or_cancel([_episode(agent, qid) for _ in range(8)])

    t0 = time.monotonic()
    with pytest.raises(RewardTimeout):
        asyncio.run(group("g-spin"))
    assert time.monotonic() - t0 < 4 and agent._processes.pool.n_started == 1
    assert asyncio.run(group("g-fine")) == [True] * 8  # after one returned, the rest ran at once
    assert agent._processes.pool.n_started <= 3
    agent._processes.close()


def test_a_slow_import_of_the_function_is_start_up_not_billed_to_its_first_call():
    # CI failed on this: the user's module (a test file importing torch) was imported inside the
    # first call, whose clock demoted it after 1 s to the idle class at a tenth of the time; on a
    # busy host the import then outran the 60 s timeout. Imported at start-up, the call is quick.
    slow = os.path.join(os.path.dirname(__file__), "slow_import_reward.py")
    p = RewardProcesses(f"{slow}:fine", n=1, nice=10)
    try:
        t0 = time.monotonic()
        assert asyncio.run(p.call("Q", " 7", {"query_id": "q"}, timeout=1.5)) == 1.0
        assert time.monotonic() - t0 >= 2.5  # the import ran, before the call's clock started
        assert psutil.Process(p.pool.worker_pids()[0]).nice() == 10  # niced after start-up
    finally:
        p.close()
