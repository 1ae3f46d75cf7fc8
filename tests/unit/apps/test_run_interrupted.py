"""A signal outside a launch (the evaluations before and after training) ends the run wherever it
lands in the main thread, asyncio's callbacks included: the evaluation's event loop spends most of
its time in them, and asyncio logs and drops any exception from a callback other than
KeyboardInterrupt and SystemExit (CI once saw a SIGTERM during the evaluation go unnoticed and the
run train on)."""

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from realhf.apps.train import RunInterrupted, Stage


def later(loop, seconds):
    """A future done after `seconds` (a coroutine never stepped would warn when dropped)."""
    done = loop.create_future()
    loop.call_later(seconds, done.set_result, None)
    return done


def test_run_interrupted_raised_in_a_callback_ends_the_event_loop():
    loop = asyncio.new_event_loop()

    def callback():
        raise RunInterrupted(signal.SIGTERM)

    try:
        loop.call_soon(callback)
        with pytest.raises(RunInterrupted) as e:
            loop.run_until_complete(later(loop, 5))
        assert e.value.signum == signal.SIGTERM
    finally:
        loop.close()


@pytest.mark.system  # the signal's sender is a process of its own
def test_a_real_signal_during_a_loop_busy_in_callbacks_ends_it():
    # As in the evaluation: callbacks one after the other (an engine thread's tokens, the grader's
    # futures), the coroutine awaited rarely stepped; the signal comes from outside.
    loop = asyncio.new_event_loop()
    deadline = time.monotonic() + 10

    def busy():
        end = time.monotonic() + 0.001
        while time.monotonic() < end:
            pass
        if time.monotonic() < deadline:
            loop.call_soon(busy)

    previous = signal.signal(signal.SIGUSR1, Stage().on_signal)
    # From another process, as a real interruption comes: a thread of this one waits for the GIL,
    # which a loop this busy can keep from it for seconds.
    sender = subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -USR1 {os.getpid()}"])
    try:
        loop.call_soon(busy)
        with pytest.raises(RunInterrupted) as e:
            loop.run_until_complete(later(loop, 10))
        assert e.value.signum == signal.SIGUSR1 and str(e.value) == "SIGUSR1"
        assert time.monotonic() < deadline - 5, "the loop ran on after the signal"
    finally:
        sender.kill()
        sender.wait(timeout=10)
        signal.signal(signal.SIGUSR1, previous)
        loop.close()


def test_a_signal_swallowed_on_the_way_ends_the_run_at_the_next_stage():
    # A broad `except` in a library can still catch RunInterrupted; the record of the signal
    # ends the run when it moves on, blaming the stage the signal came in.
    stage = Stage()
    stage.enter("the evaluation before training")
    try:
        stage.on_signal(signal.SIGTERM, None)
    except BaseException:  # noqa: BLE001 - what a careless library does
        pass
    with pytest.raises(RunInterrupted) as e:
        stage.enter("the trial's start")
    assert e.value.signum == signal.SIGTERM and stage.now == "the evaluation before training"


class SignalledWhileCollected:
    """An object whose `__del__` is where the signal lands (as a regex module's `Group.__del__`
    once caught a Ctrl-C during the evaluation, which went on to its end)."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs at the next instruction, in here
        for _ in range(1000):
            pass


@pytest.fixture
def alarm_free():
    """SIGALRM as a run's process has it: pytest-timeout's alarm (pytest.ini) parked meanwhile."""
    handler = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    left, _ = signal.setitimer(signal.ITIMER_REAL, 0)
    yield
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, left)


def test_a_signal_landing_in_a_destructor_is_raised_again_once_it_is_done(alarm_free, capfd):
    hook, previous = sys.unraisablehook, signal.getsignal(signal.SIGUSR1)
    with pytest.raises(RunInterrupted) as e, Stage().handling_signals((signal.SIGUSR1,)):
        SignalledWhileCollected()  # dropped at once: its __del__ runs here
        for _ in range(10**7):  # about a second of work that the signal must cut short
            pass
    assert e.value.signum == signal.SIGUSR1
    assert sys.unraisablehook is hook and signal.getsignal(signal.SIGUSR1) is previous
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    assert "Exception ignored" not in capfd.readouterr().err


def test_where_the_process_uses_sigalrm_itself_the_swallowed_signal_waits_for_the_next_stage(capfd):
    # Under pytest-timeout's alarm, as under a user's own: it is left alone, and the record ends
    # the run at the next stage, the traceback still not printed.
    alarm = signal.getsignal(signal.SIGALRM)
    stage = Stage()
    with stage.handling_signals((signal.SIGUSR1,)):
        SignalledWhileCollected()
    assert signal.getsignal(signal.SIGALRM) is alarm and stage.interrupted == signal.SIGUSR1
    with pytest.raises(RunInterrupted):
        stage.enter("the trial's start")
    assert "Exception ignored" not in capfd.readouterr().err


def test_other_unraisable_exceptions_still_reach_the_previous_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)

    class Broken:
        def __del__(self):
            raise ValueError("in a destructor")

    with Stage().handling_signals():
        Broken()
    assert [type(u.exc_value) for u in seen] == [ValueError]
