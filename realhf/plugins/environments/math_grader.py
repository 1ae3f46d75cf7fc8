"""The math grader: does a generated solution reach the reference answer?

Plain numbers on both sides (the tiny task's `#### 3`) are compared exactly in this process
(`math_answer`) and never reach the pool. Anything else goes to math-verify, which runs in a
`HardTimeoutPool` (`realhf.base.hard_timeout_pool`): math-verify bounds its work with
`signal.alarm`, which raises `ValueError` outside the main thread, and its timeout exception
derives from `BaseException`, so only a subprocess that can be killed bounds a pathological
expression. A check that overruns counts as wrong.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional, Sequence

from realhf.base.hard_timeout_pool import HardTimeoutPool, TaskFailed, TaskTimeout
from realhf.plugins.environments.math_answer import extract_answer, numbers_equal

logger = logging.getLogger("realhf.math_grader")

DEFAULT_VERIFY_TARGET = "realhf.plugins.environments.math_grader:verify_equivalent"


def verify_equivalent(pred: str, ref: str) -> bool:
    """math-verify's equivalence check. Runs inside a pool worker: no timeouts of its own (they
    rely on signals); the pool kills the worker instead."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeouts disabled" is on purpose

    def _parse(s: str) -> list:
        # The answer span is already extracted: boxing it makes math-verify read all of it
        # (bare "1+x^2" would be read as "1", bare "x^2+1" not at all).
        out = parse(f"\\boxed{{{s}}}", parsing_timeout=None)
        return out or parse(s, parsing_timeout=None)

    gold, answer = _parse(ref), _parse(pred)
    if not gold or not answer:
        return False
    return bool(verify(gold, answer, timeout_seconds=None))


class MathGrader:
    """Does a generated solution reach the reference answer?

        with MathGrader() as g:
            g.grade("... #### 3", [" 5-2=3\\n#### 3"])  # True, without touching the pool

    A check that math-verify cannot finish within `timeout` s counts as wrong.
    """

    def __init__(
        self,
        n_workers: int = 2,
        timeout: float = 5.0,
        verify_target: str = DEFAULT_VERIFY_TARGET,
        preload: Sequence[str] = ("math_verify",),
    ):
        # math_verify imports sympy (~1 s): preloaded at worker start so it is not billed to
        # the first task's timeout.
        self._pool = HardTimeoutPool(verify_target, n_workers=n_workers, timeout=timeout, preload=preload)
        self._n_workers = n_workers
        self._executor: Optional[ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self.n_timeouts = 0
        self.n_errors = 0

    @property
    def pool(self) -> HardTimeoutPool:
        return self._pool

    @staticmethod
    def _fast_verdict(pred: str, refs: Sequence[str]) -> Optional[bool]:
        """True/False when every comparison is number-to-number; None if math-verify is needed."""
        undecided = False
        for ref in refs:
            same = numbers_equal(pred, ref)
            if same:
                return True
            undecided = undecided or same is None
        return None if undecided else False

    @staticmethod
    def _references(solutions: Sequence[str]) -> List[str]:
        # A solution without a recognisable final answer is taken as the answer itself.
        return [extract_answer(s) or s.strip() for s in solutions]

    def _verify(self, pred: str, refs: Sequence[str]) -> bool:
        for ref in refs:
            same = numbers_equal(pred, ref)
            if same:
                return True
            if same is False:
                continue
            try:
                if self._pool.run(pred, ref):
                    return True
            except TaskTimeout as e:
                with self._stats_lock:
                    self.n_timeouts += 1
                logger.warning("math-verify timed out, graded as wrong: %s", e)
            except TaskFailed as e:
                with self._stats_lock:
                    self.n_errors += 1
                logger.warning("math-verify failed, graded as wrong: %s", e)
        return False

    def grade(self, text: str, solutions: Sequence[str]) -> bool:
        pred = extract_answer(text)
        if pred is None:
            return False
        refs = self._references(solutions)
        fast = self._fast_verdict(pred, refs)
        return fast if fast is not None else self._verify(pred, refs)

    async def agrade(self, text: str, solutions: Sequence[str]) -> bool:
        pred = extract_answer(text)
        if pred is None:
            return False
        refs = self._references(solutions)
        fast = self._fast_verdict(pred, refs)
        if fast is not None:
            return fast
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._get_executor(), self._verify, pred, refs)

    def _get_executor(self) -> ThreadPoolExecutor:
        with self._executor_lock:
            if self._executor is None:
                # One thread per worker: more would only queue on the pool's semaphore.
                self._executor = ThreadPoolExecutor(self._n_workers, thread_name_prefix="math-grader")
            return self._executor

    def close(self) -> None:
        self._pool.close()
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=True)
                self._executor = None

    def __enter__(self) -> "MathGrader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
