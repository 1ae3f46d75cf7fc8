"""Issue 27 item 4: one trial, one run. The lock is held by a real other process; it is refused
naming that process, and taken over once that process is SIGKILLed (the kernel drops a dead
holder's flock)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.paths import REPO
from realhf.base.trial_lock import TrialLock, TrialLockedError

pytestmark = pytest.mark.system

HOLDER = """
import sys, time
from realhf.base.trial_lock import TrialLock
TrialLock(sys.argv[1]).acquire()
print("LOCKED", flush=True)
time.sleep(600)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process that holds the lock at tmp_path/locks/exp/trial.lock until killed."""
    path = str(tmp_path / "locks" / "exp" / "trial.lock")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, path], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "LOCKED"
        yield proc, path
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()


def test_a_second_lock_is_refused_naming_the_live_holders_pid_host_and_what_to_do(holder, no_leftover_processes):
    proc, path = holder
    with pytest.raises(TrialLockedError) as refused:
        TrialLock(path).acquire()
    message = str(refused.value)
    assert isinstance(refused.value, RuntimeError)
    assert f"pid {proc.pid} on host {socket.gethostname()}" in message, message
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(json.load(open(path))["started"]))
    assert f"started {started}" in message and path in message
    assert f"kill {proc.pid}" in message and "another trial_name" in message


def test_the_lock_of_a_sigkilled_holder_is_taken_over(holder, no_leftover_processes):
    proc, path = holder
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with TrialLock(path):
        record = json.load(open(path))
    assert record["pid"] != proc.pid


def test_release_lets_another_process_acquire(tmp_path, no_leftover_processes):
    path = str(tmp_path / "trial.lock")
    lock = TrialLock(path).acquire()
    take = "import sys; from realhf.base.trial_lock import TrialLock; TrialLock(sys.argv[1]).acquire()"
    while_held = subprocess.run([sys.executable, "-c", take, path], cwd=REPO, capture_output=True, text=True)
    assert while_held.returncode != 0 and "TrialLockedError" in while_held.stderr
    lock.release()
    after = subprocess.run([sys.executable, "-c", take, path], cwd=REPO, capture_output=True, text=True)
    assert after.returncode == 0, after.stderr
    assert (tmp_path / "trial.lock").exists()  # release deletes nothing


def test_the_record_is_json_naming_this_process(tmp_path):
    path = tmp_path / "trial.lock"
    path.write_text('{"host": "old", "pid": 1, "started": 0, "cmdline": "a much longer record of a dead run"}')
    with TrialLock(str(path)):
        record = json.loads(path.read_text())  # the old, longer record's tail is cut
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert set(record) == {"host", "pid", "started", "cmdline"} and record["started"] > 0
