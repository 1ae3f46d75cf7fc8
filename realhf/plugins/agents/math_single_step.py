"""The `math-single-step` agent: one answer to the row's prompt, graded.

    reward = +1 right, −1 wrong      (then the framework's shaping: (reward − reward_bias)·reward_scaling)

Graded by the episode's environment (`rollout.env.type=math`, or any other whose reward > 0
means right, e.g. `code`; the numbers of the step's `info["metrics"]` go into `Outcome.info`), or, when `rollout.agent.reward_fn`
names a function `module:function`, by `reward_fn(prompt, completion, **row)` (the row's other
fields as keywords; may be async): a number is the reward, True/False mean ±1.

User code never blocks the rollout worker's event loop, and a call that never returns is
stopped: a synchronous reward_fn runs in `rollout.agent.reward_processes` subprocesses
(realhf.plugins.agents.reward_processes; with `reward_isolation=thread`, in one of the agent's
`reward_threads` daemon threads instead), an async one on the loop; all are bounded by
`rollout.agent.reward_timeout`, past which the call is killed (a process), cancelled (a
coroutine) or abandoned (a thread), and the episode fails with `RewardTimeout` naming the
function, the prompt and the timeout (the rollout worker counts it `reward_timed_out` and frees
its slot).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import time
from typing import Any, Callable, Dict, Optional

from realhf.api.agent import Agent, EpisodeResult, Outcome, RewardTimeout, load_reward_fn, register_agent
from realhf.api.cli_args import AgentConfig
from realhf.base.daemon_threads import DaemonThreads
from realhf.base.hard_timeout_pool import TaskTimeout
from realhf.plugins.agents.reward_processes import RewardProcesses, SamePromptTimedOut

DEFAULT_REWARD_TIMEOUT_S = AgentConfig.reward_timeout  # for callers without a config (scripts, tests)


# Why processes by default, and threads still on offer: a thread stuck in a call cannot be
# stopped, and it holds the interpreter (a reward_fn spinning on 3% of prompts slowed a run ten
# times; one sleeping on 30% used up every thread, issue 49); a process is killed at the timeout.
# Threads keep what processes cannot: row values and rewards that are not JSON, and state shared
# with the rollout worker (reward_isolation=thread).


def _is_async(fn: Callable) -> bool:
    # An object whose __call__ is `async def` (its class's, as Python looks it up).
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


def _name_of(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"


class _Overran(Exception):
    pass


async def _within(future: asyncio.Future, timeout: float) -> Any:
    """`future`'s result, or _Overran after `timeout` s (the future cancelled). Not wait_for: a
    TimeoutError the user's function raises itself (a socket timeout) must pass through as such,
    not be read as ours."""
    try:
        done, _ = await asyncio.wait({future}, timeout=timeout)
    except asyncio.CancelledError:  # the episode was cancelled: so is the call
        future.cancel()
        raise
    if not done:
        future.cancel()
        raise _Overran
    return future.result()


async def call_reward_fn(
    fn: Callable,
    row: Dict[str, Any],
    completion: str,
    *,
    timeout: float = DEFAULT_REWARD_TIMEOUT_S,
    threads: Optional[DaemonThreads] = None,
    processes: Optional[RewardProcesses] = None,
    name: str = "",
    key: str = "rollout.agent.reward_fn",
) -> Any:
    """`fn(prompt, completion, **row)` within `timeout` s: a synchronous fn in `processes` (killed
    at the timeout) or else one of `threads` (the event loop goes on meanwhile), an async one on
    the loop (cancelled at the timeout). RewardTimeout names the function (`key`=`name`, default
    its module:qualname) and the prompt."""
    others = {k: v for k, v in row.items() if k not in ("prompt", "completion")}
    if processes is not None and not _is_async(fn):
        try:
            return await processes.call(row.get("prompt", ""), completion, others, timeout)
        except SamePromptTimedOut:
            where = _where(name or _name_of(fn), row, timeout, key)
            raise RewardTimeout(f"{where} (its first call for this prompt did not: this one was not made)") from None
        except TaskTimeout:
            where = _where(name or _name_of(fn), row, timeout, key)
            raise RewardTimeout(f"{where}; its process was killed. Make it faster or raise the timeout.") from None
    call = functools.partial(fn, row.get("prompt", ""), completion, **others)
    deadline = time.monotonic() + timeout
    # A caller without an agent (a script, a test) gets a thread of its own for this call.
    threads = None if _is_async(fn) else threads or DaemonThreads(1, name="reward")
    try:
        if threads is None:
            return await _within(asyncio.ensure_future(call()), timeout)
        value = await _within(asyncio.wrap_future(threads.submit(call)), timeout)
        if inspect.isawaitable(value):  # a sync callable that returned a coroutine: the rest of the time
            value = await _within(asyncio.ensure_future(value), max(0.0, deadline - time.monotonic()))
        return value
    except _Overran:
        raise _timeout_error(name or _name_of(fn), row, timeout, threads, key) from None


def _where(name: str, row: Dict[str, Any], timeout: float, key: str) -> str:
    timeout_key = key.rsplit(".", 1)[0] + ".reward_timeout"
    return f"{key}={name} did not return within {timeout_key}={timeout:g}s for prompt {row.get('query_id', '?')!r}"


def _timeout_error(
    name: str, row: Dict[str, Any], timeout: float, threads: Optional[DaemonThreads], key: str
) -> RewardTimeout:
    where = _where(name, row, timeout, key)
    if threads is None:
        return RewardTimeout(f"{where}; the coroutine was cancelled. Make it faster or raise the timeout.")
    stuck = f"{threads.busy}/{threads.size} reward threads are busy in calls that have not returned"
    if threads.busy >= threads.size:
        return RewardTimeout(
            f"{where}: no free reward thread ({stuck}); the function blocks — make it return "
            "(or make it async), or raise the timeout."
        )
    return RewardTimeout(
        f"{where}; its thread stays busy until the call returns ({stuck}). Make it faster, "
        "make it async, or raise the timeout."
    )


def graded(env_reward: float) -> Outcome:
    """±1 for the environment's verdict; a non-finite one is passed on, so the group is refused
    as malformed (and logged) instead of silently graded wrong."""
    if not math.isfinite(env_reward):
        return Outcome(env_reward, success=False)
    return Outcome(1.0 if env_reward > 0 else -1.0, success=env_reward > 0)


@register_agent("math-single-step")
class MathSingleStepAgent(Agent):
    # Threads a synchronous reward_fn may hold at once (realhf.base.daemon_threads: a stuck call keeps
    # its thread). The pool only grows to the calls in flight together (at most the worker's
    # running episodes), so a generous bound costs nothing until calls get stuck, and lets a
    # slow but honest function run concurrently; a subclass may change it.
    reward_threads = 128
    one_generation_per_episode = True  # one answer to the row's prompt: a group may be one request

    def __init__(self, config: Any = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        cfg = config if config is not None else AgentConfig()  # the config tree's defaults
        self.reward_fn_name = cfg.reward_fn
        self.reward_fn = load_reward_fn(self.reward_fn_name)
        self.reward_timeout = float(cfg.reward_timeout)
        self._threads = self._processes = None
        if self.reward_fn is None or _is_async(self.reward_fn):
            pass
        elif cfg.reward_isolation == "process":
            self._processes = RewardProcesses(self.reward_fn_name, cfg.reward_processes, cfg.reward_nice)
        else:
            self._threads = DaemonThreads(self.reward_threads, name="reward")

    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        answer = await gen()
        if self.reward_fn is not None:
            return await call_reward_fn(
                self.reward_fn,
                row,
                answer.text,
                timeout=self.reward_timeout,
                threads=self._threads,
                processes=self._processes,
                name=self.reward_fn_name,
            )
        _, reward, _, info = await env.step(answer.text)
        outcome = graded(reward)
        if isinstance(info, dict):
            if "answer_right" in info:  # the math env: the final answer alone, beside check_work's verdict
                outcome.info["answer_right"] = float(info["answer_right"])
            # Any environment's own numbers (the code env: tests passed, why it failed).
            outcome.info.update(info.get("metrics") or {})
        return outcome
