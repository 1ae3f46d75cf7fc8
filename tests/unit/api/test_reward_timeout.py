"""User code never blocks the system (issue 27, item 1): a reward_fn that blocks or hangs fails its
episode after `rollout.agent.reward_timeout`, naming the function and the prompt, while the
rollout worker's event loop keeps running."""

import asyncio
import threading
import time

import pytest

from realhf.api.cli_args import AgentConfig
from realhf.base.daemon_threads import DaemonThreads
from realhf.experiments.validation import ConfigError, check_agent
from realhf.plugins.agents.math_single_step import MathSingleStepAgent, RewardTimeout, call_reward_fn

ROW = {"query_id": "q-7", "prompt": "Q: 5+2?\nA:", "solutions": ["#### 7"]}
TIMEOUT = 0.5
release = threading.Event()  # lets the blocked threads go at the end of a test
cancelled = []


def sleeps_in_a_thread(prompt, completion, **row):
    release.wait(30)  # a time.sleep(600) that the test can end
    return True


async def sleeps_on_the_loop(prompt, completion, **row):
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        cancelled.append(row["query_id"])
        raise
    return True


class _Answer:
    text = " #### 7"


async def _gen():
    return _Answer()


async def _episode_with_a_ticking_neighbour(agent):
    """(the episode's error, seconds it took, ticks of a 10 ms counter task on the same loop)"""
    ticks = 0

    async def counter():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(counter())
    t0 = time.monotonic()
    with pytest.raises(RewardTimeout) as e:
        await agent.run_episode(dict(ROW), _gen, None)
    took = time.monotonic() - t0
    task.cancel()
    return e.value, took, ticks


@pytest.fixture(autouse=True)
def _release_blocked_threads():
    release.clear()
    yield
    release.set()


def test_a_blocking_sync_reward_fn_fails_its_episode_at_the_timeout_while_the_loop_keeps_running():
    agent = MathSingleStepAgent(
        AgentConfig(reward_fn=f"{__name__}:sleeps_in_a_thread", reward_timeout=TIMEOUT, reward_isolation="thread")
    )
    error, took, ticks = asyncio.run(_episode_with_a_ticking_neighbour(agent))
    assert TIMEOUT <= took < TIMEOUT + 1.0
    assert ticks >= 20  # ~50 expected; a frozen loop would give 0
    message = str(error)
    assert f"rollout.agent.reward_fn={__name__}:sleeps_in_a_thread" in message
    assert "'q-7'" in message and "reward_timeout=0.5s" in message
    assert not isinstance(error, TimeoutError)  # not to be read as the episode's own timeout


def test_an_async_reward_fn_that_sleeps_too_long_is_cancelled_at_the_timeout():
    cancelled.clear()
    agent = MathSingleStepAgent(AgentConfig(reward_fn=f"{__name__}:sleeps_on_the_loop", reward_timeout=TIMEOUT))
    error, took, ticks = asyncio.run(_episode_with_a_ticking_neighbour(agent))
    assert TIMEOUT <= took < TIMEOUT + 1.0 and ticks >= 20
    assert cancelled == ["q-7"]
    assert f"{__name__}:sleeps_on_the_loop" in str(error) and "was cancelled" in str(error)


def test_when_every_reward_thread_is_stuck_later_calls_time_out_waiting_and_no_thread_is_added():
    threads = DaemonThreads(2)

    async def main():
        calls = [
            call_reward_fn(sleeps_in_a_thread, dict(ROW, query_id=f"q{i}"), "x", timeout=TIMEOUT, threads=threads)
            for i in range(3)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    before = threading.active_count()
    errors = asyncio.run(main())
    assert all(isinstance(e, RewardTimeout) for e in errors)
    assert threading.active_count() - before == 2 and threads.busy == 2
    assert "no free reward thread (2/2 reward threads are busy" in str(errors[2])
    release.set()  # the stuck calls return: their threads serve again
    assert asyncio.run(call_reward_fn(sleeps_in_a_thread, ROW, "x", timeout=TIMEOUT, threads=threads)) is True
    assert threading.active_count() - before == 2


def test_a_reward_fn_that_returns_in_time_still_grades_and_its_errors_pass_through():
    def fine(prompt, completion, solutions, **_):
        return completion.strip() == solutions[0]

    def broken(prompt, completion, **_):
        raise KeyError("no such field")

    assert asyncio.run(call_reward_fn(fine, ROW, " #### 7", timeout=TIMEOUT)) is True
    with pytest.raises(KeyError):
        asyncio.run(call_reward_fn(broken, ROW, "x", timeout=TIMEOUT))


def test_reward_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="rollout.agent.reward_timeout must be > 0"):
        check_agent(AgentConfig(reward_timeout=0))


def test_a_timeout_error_raised_by_the_reward_fn_itself_is_not_reported_as_the_reward_timeout():
    def its_own_socket_timed_out(prompt, completion, **_):
        raise TimeoutError("read timed out")

    async def async_too(prompt, completion, **_):
        raise TimeoutError("read timed out")

    for fn in (its_own_socket_timed_out, async_too):
        with pytest.raises(TimeoutError, match="read timed out"):
            asyncio.run(call_reward_fn(fn, ROW, "x", timeout=TIMEOUT))
