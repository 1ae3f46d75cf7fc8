"""realhf.base.process_exit: a worker that finished ends with its own code, even with a daemon
thread still blocked in torch's C++ (the CI failure of test_sigkilled_generation_server[2]: a
model worker logged "exiting with code 0", then an abandoned TCPStore wait timed out while the
interpreter finalized, and the process died of SIGABRT)."""

import subprocess
import sys
import textwrap

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.system

# A daemon thread waits 1 s on a key nobody sets; finalizing takes 2 s (a slow __del__, as the
# trainer's model teardown is slow), so the wait times out while the interpreter finalizes.
PROGRAM = textwrap.dedent(
    """
    import atexit, datetime, logging, sys, threading, time
    import torch.distributed as dist
    from realhf.base.process_exit import exit_now

    out = sys.argv[2]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=1))
    threading.Thread(target=lambda: store.get("never set"), daemon=True).start()

    class SlowTeardown:
        def __del__(self, sleep=time.sleep):
            sleep(2)

    keep = SlowTeardown()

    def late_writer():
        time.sleep(0.5)
        open(out + ".thread", "w").write("joined")

    threading.Thread(target=late_writer).start()
    atexit.register(lambda: open(out + ".atexit", "w").write("ran"))
    log = logging.getLogger("t")
    log.addHandler(logging.FileHandler(out + ".log"))
    log.warning("last line")
    print("buffered, not flushed", end="")
    if sys.argv[1] == "exit_now":
        exit_now(0)
    sys.exit(0)
    """
)


def _run(tmp_path, how):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = tmp_path / "out"
    return subprocess.run([sys.executable, str(script), how, str(out)], capture_output=True, text=True, timeout=60), out


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the abort is CPython 3.11's daemon-thread teardown")
def test_sys_exit_aborts_when_a_c10d_wait_times_out_during_finalization(tmp_path):
    """The hazard itself, so that the test below is known to guard against something real."""
    proc, _ = _run(tmp_path, "sys_exit")
    assert proc.returncode == -6, (proc.returncode, proc.stderr[-2000:])
    assert "terminate called without an active exception" in proc.stderr


def test_exit_now_keeps_the_code_and_does_what_finalization_would(tmp_path):
    proc, out = _run(tmp_path, "exit_now")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr
    assert proc.stdout == "buffered, not flushed"
    assert (tmp_path / "out.thread").read_text() == "joined"  # a non-daemon thread was waited for
    assert (tmp_path / "out.atexit").read_text() == "ran"
    assert (tmp_path / "out.log").read_text() == "last line\n"


def test_exit_now_passes_the_code_on_and_bounds_the_wait_for_threads(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(
        "import threading, time\n"
        "from realhf.base.process_exit import exit_now\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='stuck-writer').start()\n"
        "exit_now(3, threads_join_s=0.5)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "thread 'stuck-writer' still running after 0.5s; exiting without it" in proc.stderr


# The same hazard in a command-line entry point: the daemon thread's wait starts in the last
# atexit handler, so that its timeout (1 s) falls in the finalization (2 s); the entry's own exit
# code must come out.
ENTRY_PROGRAM = textwrap.dedent(
    """
    import atexit, datetime, runpy, sys, threading, time
    import torch.distributed as dist

    class SlowTeardown:
        def __del__(self, sleep=time.sleep):
            sleep(2)

    keep = SlowTeardown()

    def hazard():
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=1))
        threading.Thread(target=lambda: store.get("never set"), daemon=True).start()

    atexit.register(hazard)  # the first registered runs last
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


@pytest.mark.parametrize(
    "entry, args, code",
    [
        ("training/main_async_ppo.py", ["--help"], 0),
        ("training/main_async_ppo.py", ["no_such_key=1"], 2),
        ("training/main_sft.py", ["no_such_key=1"], 2),
        ("training/main_rm.py", ["no_such_key=1"], 2),
        ("realhf/apps/remote.py", ["worker"], 2),  # argparse's SystemExit: --config missing
        ("realhf/apps/remote.py", ["worker", "--config", "/no/such/worker.yaml"], 1),  # an escaping exception
        ("realhf/apps/sft_rank.py", [], 2),
    ],
)
def test_the_entry_points_exit_with_their_code_whatever_a_daemon_thread_does(tmp_path, entry, args, code):
    script = tmp_path / "entry.py"
    script.write_text(ENTRY_PROGRAM)
    proc = subprocess.run(
        [sys.executable, str(script), entry, *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "terminate called" not in proc.stderr


@pytest.mark.parametrize(
    "body, code, stderr",
    [
        ("return None", 0, ""),
        ("return 4", 4, ""),
        ("raise SystemExit('bad key x')", 1, "bad key x\n"),
        ("raise ValueError('broken config')", 1, "ValueError: broken config\n"),
        ("raise KeyboardInterrupt", 130, "KeyboardInterrupt\n"),
    ],
)
def test_run_then_exit_reads_the_outcome_as_the_interpreter_would(tmp_path, body, code, stderr):
    script = tmp_path / "main.py"
    script.write_text(
        f"from realhf.base.process_exit import run_then_exit\ndef main():\n    {body}\nrun_then_exit(main)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr.endswith(stderr)) == (code, True), proc.stderr[-2000:]
    if code == 1 and "Error" in stderr:
        assert "Traceback (most recent call last)" in proc.stderr
