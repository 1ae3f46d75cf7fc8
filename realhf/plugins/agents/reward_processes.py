"""A user's synchronous reward function in subprocesses that can be killed: `RewardProcesses`.

A call that overruns `rollout.agent.reward_timeout` kills its process (a fresh one takes the next
call), so a function that spins or sleeps forever on some prompts costs those prompts — counted
`reward_timed_out` — and nothing else: no thread of the rollout worker stays stuck holding the
interpreter, and no pool of threads runs dry. Processes start as calls need them, up to
`reward_processes`, so calls stuck on some prompts leave others to grade the rest; an episode
cancelled (its group failed on another sample's timeout, or the run ends) kills its call's
process at once. Each prompt's first call runs alone (`_FirstCallGate`): a prompt the function
never returns on holds one process, not one per sample of its group. The processes run at
`reward_nice`, and a call still running after DEMOTE_AFTER_S drops to the idle scheduling class
and is stopped nine tenths of the time (hard_timeout_pool.THROTTLE_*): a call that spins until
it is killed then costs the trainer and the servers little (a legitimately slow one finishes ten
times slower).

What crosses: the prompt, the completion and the row's fields go to the process as JSON and the
reward comes back as JSON (realhf.base.hard_timeout_pool: JSON lines on pipes, nothing
unpickled), so the row's values must be JSON-able (a dataset's are) and the function returns a
number, a bool, None or an Outcome. Each process imports the function once, by the name it was
given (`module:function` or `path/to/file.py:function`, from the launch directory) as it starts,
before its first call's clock runs, and keeps
its module's state between calls; state shared with the rollout worker's own copy is not.
Async functions stay on the rollout worker's event loop, where the timeout cancels them.

Measured (docs/benchmarks.md, "Reward functions that never return"): a call costs 0.24 ms against
0.09 ms in a thread; a function spinning forever on 3% of the prompts left a run 0.84× the
samples/s of a clean one (0.03× in threads).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import threading
import traceback
from collections import OrderedDict
from typing import Any, Callable, Dict

from realhf.base.daemon_threads import DaemonThreads
from realhf.base.hard_timeout_pool import HardTimeoutPool, TaskFailed, TaskTimeout

_WORKER_TARGET = "realhf.plugins.agents.reward_processes:call_in_worker"
_WORKER_INIT = "realhf.plugins.agents.reward_processes:load_in_worker"
# A reward call takes milliseconds; one still running after this long is stuck (or heavy), and
# from then on runs in the idle scheduling class: on CPU the trainer and the servers leave free.
DEMOTE_AFTER_S = 1.0
# A call waits this long for a busy process before another is started: calls of milliseconds
# share a few processes; only calls that stay stuck make the pool grow toward reward_processes.
SPAWN_AFTER_S = 0.05
_loaded: Dict[str, Callable] = {}  # in a worker: the user's functions by name, imported once


def load_in_worker(name: str) -> None:
    """In a pool process, as it starts: import the user's function. Its import (torch, a
    tokenizer, a verifier...) then runs at the worker's start-up priority and within the start-up
    timeout — not inside the first call, whose clock would demote and throttle it (DEMOTE_AFTER_S)
    and could time it out on a busy machine."""
    from realhf.api.agent import load_reward_fn

    _loaded[name] = load_reward_fn(name)


def call_in_worker(name: str, prompt: str, completion: str, row: Dict[str, Any]) -> Any:
    """In a pool process: `name(prompt, completion, **row)` as JSON (an Outcome, or the error it
    raised and where, as a dict)."""
    from realhf.api.agent import Outcome

    fn = _loaded[name]
    try:
        value = fn(prompt, completion, **row)
        if inspect.isawaitable(value):  # a sync callable that returned a coroutine
            value = asyncio.run(value)
    except Exception as e:  # noqa: BLE001 - the caller gets it as text, with where it was raised
        last = traceback.extract_tb(e.__traceback__)[-1]
        return {"__error__": f"{type(e).__name__}: {e}", "where": f"{last.filename}:{last.lineno} in {last.name}"}
    if isinstance(value, Outcome):
        return {"__outcome__": dataclasses.asdict(value)}
    if hasattr(value, "item") and callable(value.item):  # numpy and torch scalars
        value = value.item()
    if value is not None and not isinstance(value, (bool, int, float)):
        raise TypeError(f"returned a {type(value).__name__}; a reward is a number, a bool, None or an Outcome")
    return value


def from_worker(value: Any) -> Any:
    """The reward as the agent takes it (an Outcome back from its dict)."""
    if isinstance(value, dict) and "__outcome__" in value:
        from realhf.api.agent import Outcome

        return Outcome(**value["__outcome__"])
    if isinstance(value, dict) and "__error__" in value:
        raise RewardCallFailed(f"raised {value['__error__']} at {value['where']}")
    return value


class RewardCallFailed(Exception):
    """The reward function raised in its process (its error, by type and message), or the process died."""


class SamePromptTimedOut(TaskTimeout):
    """Not called: the first call for the same prompt did not return within the timeout."""


class _Probe:
    def __init__(self):
        self.done = asyncio.Event()
        self.timed_out = False


class _FirstCallGate:
    """Per prompt, its first reward call runs alone; the others wait until it has returned, then
    run at once — or, when it timed out, end at once with SamePromptTimedOut (their group fails
    on that timeout anyway). A prompt the function never returns on holds one process until the
    timeout rather than one per sample of its group; a prompt it returns on waits one call's time."""

    def __init__(self, remember: int = 100_000):
        self._cleared: "OrderedDict[str, None]" = OrderedDict()  # prompts a call has returned on
        self._probing: Dict[str, _Probe] = {}  # prompts whose first call is running
        self._remember = remember

    async def enter(self, key: str) -> None:
        while key not in self._cleared:
            probe = self._probing.get(key)
            if probe is None:
                self._probing[key] = _Probe()  # this call is the prompt's probe
                return
            await probe.done.wait()
            if probe.timed_out:
                raise SamePromptTimedOut(f"the first call for prompt {key!r} did not return in time")

    def leave(self, key: str, returned: bool, timed_out: bool) -> None:
        probe = self._probing.pop(key, None)
        if probe is None:
            return  # not the probe
        if returned:
            self._cleared[key] = None
            if len(self._cleared) > self._remember:
                self._cleared.popitem(last=False)
        probe.timed_out = timed_out
        probe.done.set()  # the waiters run (or end); a later call probes again


class RewardProcesses:
    """`n` processes calling the reward function `name`; `await call(prompt, completion, row,
    timeout)` gives its value, or raises TaskTimeout (realhf.base.hard_timeout_pool: the process
    was killed; SamePromptTimedOut: not called, its prompt's first call timed out), PoolClosed,
    or RewardCallFailed. Processes start as calls need them; `close()` kills them (so does the
    interpreter's exit)."""

    def __init__(self, name: str, n: int, nice: int):
        self.name = name
        self.pool = HardTimeoutPool(
            _WORKER_TARGET,
            n_workers=n,
            nice=nice,
            spawn_after=SPAWN_AFTER_S,
            initializer=_WORKER_INIT,
            initargs=(name,),
        )
        # The pool's calls block a thread each: one per process, plus those waiting for a process
        # (each waits on the pool's semaphore, where a cancelled call leaves the queue). Daemon
        # threads: the worker's exit does not wait for them (realhf.base.process_exit).
        self._threads = DaemonThreads(4 * n, name="reward-call")
        self._gate = _FirstCallGate()

    @property
    def n_timeouts(self) -> int:
        return self.pool.n_timeouts

    async def call(self, prompt: str, completion: str, row: Dict[str, Any], timeout: float) -> Any:
        try:
            json.dumps(row)
        except (TypeError, ValueError) as e:
            raise RewardCallFailed(
                f"{self.name}: the row's fields must be JSON to reach the reward processes ({e}); "
                "set rollout.agent.reward_isolation=thread to call it in the rollout worker instead"
            ) from None
        cancel = threading.Event()
        call = functools.partial(
            self.pool.run,
            self.name,
            prompt,
            completion,
            row,
            timeout=timeout,
            cancel=cancel,
            demote_after=DEMOTE_AFTER_S,
        )
        key = str(row.get("query_id") or prompt)
        await self._gate.enter(key)
        returned = timed_out = False
        try:
            # Shielded: a cancelled episode (its group failed, the run ends) sets `cancel`, and the
            # call's process is killed (or the call dropped from the queue) before this returns.
            value = await asyncio.shield(fut := asyncio.wrap_future(self._threads.submit(call)))
            returned = True
        except asyncio.CancelledError:
            cancel.set()
            await asyncio.wait({fut})
            raise
        except TaskTimeout:
            timed_out = True
            raise
        except TaskFailed as e:  # the process died, or the function does not load
            raise RewardCallFailed(f"{self.name}: {e}") from None
        finally:
            self._gate.leave(key, returned, timed_out)
        try:
            return from_worker(value)
        except RewardCallFailed as e:
            raise RewardCallFailed(f"{self.name} {e}") from None

    def close(self) -> None:
        self.pool.close()  # calls in flight end with PoolClosed; their threads go back to waiting
