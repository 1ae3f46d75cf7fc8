"""A signal outside a launch (the evaluations before and after training) ends the run wherever it
lands in the main thread, asyncio's callbacks included: the evaluation's event loop spends most of
its time in them, and asyncio logs and drops any exception from a callback other than
KeyboardInterrupt and SystemExit (CI once saw a SIGTERM during the evaluation go unnoticed and the
run train on)."""

import asyncio
import os
import signal
import subprocess
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
