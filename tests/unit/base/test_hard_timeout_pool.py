"""The grader's process pool: a hard per-task timeout that really kills, and no leftovers."""

import os
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from realhf.base.hard_timeout_pool import HardTimeoutPool, PoolClosed, TaskCancelled, TaskFailed, TaskTimeout
from realhf.plugins.environments.math_grader import MathGrader

pytestmark = pytest.mark.system


def _children() -> set:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_overrunning_task_is_killed_and_the_pool_keeps_working():
    pool = HardTimeoutPool("time:sleep", n_workers=1, timeout=0.5)
    try:
        assert pool.run(0.01) is None  # time.sleep returns None
        [stuck_pid] = pool.worker_pids()
        t0 = time.monotonic()
        with pytest.raises(TaskTimeout, match="overran 0.5 s"):
            pool.run(60)
        assert time.monotonic() - t0 < 5  # the hard kill, not the 60 s sleep
        assert _gone(stuck_pid)
        assert pool.n_timeouts == 1
        assert pool.run(0.01) is None  # a fresh worker took over
        assert pool.worker_pids() != [stuck_pid] and pool.n_started == 2
    finally:
        pool.close()


def test_per_call_timeout_overrides_the_default():
    pool = HardTimeoutPool("time:sleep", n_workers=1, timeout=0.2)
    try:
        assert pool.run(0.5, timeout=10) is None
        with pytest.raises(TaskTimeout):
            pool.run(10)
    finally:
        pool.close()


def test_an_exception_in_the_task_is_reported_and_the_worker_survives():
    pool = HardTimeoutPool("math:sqrt", n_workers=1)
    try:
        with pytest.raises(TaskFailed, match="ValueError: math domain error"):
            pool.run(-1)
        assert pool.run(16) == 4.0
        assert pool.n_started == 1
    finally:
        pool.close()


def test_a_bad_target_fails_at_start_up_with_its_name():
    pool = HardTimeoutPool("no_such_module_xyz:f", n_workers=1, startup_timeout=30)
    try:
        with pytest.raises(TaskFailed, match="no_such_module_xyz:f"):
            pool.run(1)
    finally:
        pool.close()


def test_close_leaves_no_process_behind_and_refuses_new_work():
    before = _children()
    pool = HardTimeoutPool("time:sleep", n_workers=2, timeout=5)
    with ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(pool.run, 0.01), ex.submit(pool.run, 0.3)]
        assert [f.result() for f in futures] == [None, None]
    pids = pool.worker_pids()
    assert len(pids) == 2 and set(pids) <= _children()
    pool.close()
    assert _children() == before
    assert all(_gone(p) for p in pids)
    with pytest.raises(PoolClosed):
        pool.run(0.01)


def test_close_kills_a_busy_worker_and_its_caller_gets_pool_closed():
    before = _children()
    pool = HardTimeoutPool("time:sleep", n_workers=1, timeout=60)
    pool.run(0)
    errors = []
    t = threading.Thread(target=lambda: errors.append(_catch(lambda: pool.run(60))))
    t.start()
    time.sleep(0.3)
    before_close = time.monotonic()
    pool.close()
    t.join(timeout=10)
    assert not t.is_alive() and time.monotonic() - before_close < 10
    assert isinstance(errors[0], PoolClosed)
    assert not pool.worker_pids() and _children() == before


def _catch(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return e
    return None


@pytest.fixture
def slow_verifier(tmp_path, monkeypatch):
    """A verify function that hangs on the answer "\\slow", importable by pool workers."""
    (tmp_path / "slow_verify_mod.py").write_text(
        textwrap.dedent(
            """
            import time

            def verify(pred, ref):
                if pred == "\\\\slow":
                    time.sleep(600)
                return pred == ref
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "slow_verify_mod:verify"


def test_grader_counts_a_stuck_check_as_wrong_and_keeps_working(slow_verifier):
    before = _children()
    with MathGrader(n_workers=1, timeout=0.5, verify_target=slow_verifier, preload=()) as g:
        assert g.grade("\\boxed{y}", ["\\boxed{y}"]) is True
        [first] = g.pool.worker_pids()
        t0 = time.monotonic()
        assert g.grade("\\boxed{\\slow}", ["\\boxed{y}"]) is False
        assert time.monotonic() - t0 < 5
        assert g.n_timeouts == 1 and _gone(first)
        assert g.grade("\\boxed{y}", ["\\boxed{y}"]) is True  # a new worker
        assert g.grade("\\boxed{z}", ["\\boxed{y}"]) is False
        pids = g.pool.worker_pids()
    assert _children() == before
    assert all(_gone(p) for p in pids)


def test_workers_exit_when_the_parent_closes_their_pipe():
    # Orphan safety: a worker blocked waiting for work exits on EOF (what happens when the
    # parent dies without close()).
    pool = HardTimeoutPool("time:sleep", n_workers=1)
    pool.run(0)
    [worker] = list(pool._workers)
    worker.proc.stdin.close()
    assert worker.proc.wait(timeout=10) == 0
    pool.close()


def test_a_cancelled_task_has_its_worker_killed_and_a_queued_one_never_starts():
    pool = HardTimeoutPool("time:sleep", n_workers=1, timeout=30)
    cancel_running, cancel_queued = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as ex:
        running = ex.submit(pool.run, 30, cancel=cancel_running)
        while not pool.worker_pids():
            time.sleep(0.01)
        [pid] = pool.worker_pids()
        queued = ex.submit(pool.run, 30, cancel=cancel_queued)
        time.sleep(0.2)
        t0 = time.monotonic()
        cancel_queued.set()
        with pytest.raises(TaskCancelled, match="waiting for a free worker"):
            queued.result(timeout=5)
        cancel_running.set()
        with pytest.raises(TaskCancelled):
            running.result(timeout=5)
        assert time.monotonic() - t0 < 2 and _gone(pid) and pool.worker_pids() == []
    assert pool.run(0.0) is None  # a fresh worker serves the next task
    pool.close()


def test_a_long_task_drops_to_the_idle_scheduling_class_and_its_worker_is_not_reused():
    pool = HardTimeoutPool("time:sleep", n_workers=1, timeout=30, nice=5)
    with ThreadPoolExecutor(1) as ex:
        long = ex.submit(pool.run, 0.6, demote_after=0.2)
        while not pool.worker_pids():
            time.sleep(0.01)
        [pid] = pool.worker_pids()
        assert psutil.Process(pid).nice() == 5
        time.sleep(0.4)
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        long.result(timeout=5)
    assert _gone(pid)  # not reused: its priority cannot be raised back without privileges
    assert pool.run(0.0, demote_after=0.2) is None
    [fresh] = pool.worker_pids()
    assert fresh != pid and os.sched_getscheduler(fresh) == os.SCHED_OTHER  # a short task stays
    pool.close()


def test_with_spawn_after_short_tasks_share_a_worker_and_only_stuck_ones_make_the_pool_grow():
    pool = HardTimeoutPool("time:sleep", n_workers=8, timeout=30, spawn_after=0.5)
    with ThreadPoolExecutor(8) as ex:
        assert list(ex.map(lambda _: pool.run(0.002), range(40))) == [None] * 40
        assert pool.n_started == 1  # each waited for the busy one rather than start another
        stuck = [ex.submit(pool.run, 2.0) for _ in range(3)]
        time.sleep(0.2)
        t0 = time.monotonic()
        assert pool.run(0.0) is None and time.monotonic() - t0 < 1.5  # a worker was started for it
        [f.result(timeout=10) for f in stuck]
    assert 3 <= pool.n_started <= 5
    pool.close()
