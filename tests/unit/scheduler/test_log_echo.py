"""LogEcho: what the launcher's console shows of the master's log."""

from realhf.scheduler.log_echo import LogEcho, log_tail


def _echo(path, offset):
    shown = []
    echo = LogEcho(write=shown.append)
    echo.add(str(path), offset)
    echo.start()
    with open(path, "a") as f:
        f.write("step 5 v5 | new launch\nhalf a li")
    echo.stop()  # drains what is there
    return "".join(shown)


def test_a_relaunched_worker_echoes_only_its_own_lines(tmp_path):
    # A restarted trial appends to the same log: the earlier launch's lines were shown already.
    log = tmp_path / "master_worker-0.log"
    log.write_text("step 1 v1 | first launch\n")
    assert _echo(log, log.stat().st_size) == "step 5 v5 | new launch\n"  # the partial line waits


def test_a_log_added_from_its_start_echoes_everything(tmp_path):
    log = tmp_path / "master_worker-0.log"
    log.write_text("step 1 v1 | first launch\n")
    assert _echo(log, 0) == "step 1 v1 | first launch\nstep 5 v5 | new launch\n"


def test_the_tail_is_the_last_lines(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(str(log), 3) == "line 97\nline 98\nline 99"
    assert log_tail(str(tmp_path / "missing.log")).startswith("(cannot read")
