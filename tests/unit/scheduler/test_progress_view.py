"""The launcher's progress bar: its numbers come from the metrics.jsonl the master writes (here
written by the real StatsLogger), it draws only on a terminal, and echoed lines scroll above it."""

import io
import json

from rich.console import Console

from realhf.scheduler.log_echo import LogEcho
from realhf.scheduler.progress_view import JsonlTail, RunProgress, eta_text
from realhf.system.stats.stats_logger import EVAL_METRICS_FILE, StatsLogger, step_metrics, truncate_metrics


def _write_steps(log_dir, steps, step_time_s=2.0):
    """metrics.jsonl as the master writes it: step_metrics of 2 groups x 4 answers per step."""
    stats = StatsLogger(str(log_dir / "metrics.jsonl"), echo=False)
    for step in steps:
        batch = {
            "n_groups": 2,
            "n_samples": 8,
            "reward_sum": 2.0 * step - 8,
            "n_success": step,
            "n_groups_no_spread": 0,
            "n_no_eos": 0,
            "gen_tokens": 80,
            "head_offpolicyness": [0, step % 3],
            "tail_offpolicyness": [0, 0],
        }
        stats.log(
            step_metrics(
                step,
                step,
                [{"batch": batch}],
                [{"version": step, "stats": {"loss": 0.1}}],
                {},
                stale_dropped=0,
                step_time_s=step_time_s,
                wait_time_s=0.0,
                training_samples=2 * step,
            )
        )
    stats.close()


def _terminal(width=200):
    buf = io.StringIO()
    return buf, Console(file=buf, force_terminal=True, width=width, color_system=None, highlight=False)


def test_bar_shows_step_eta_reward_accuracy_throughput_and_staleness_of_the_last_step(tmp_path):
    _write_steps(tmp_path, [1, 2, 3, 4])
    (tmp_path / EVAL_METRICS_FILE).write_text(json.dumps({"step": 2, "version": 2, "eval/accuracy": 0.4}) + "\n")
    buf, console = _terminal()
    view = RunProgress(str(tmp_path), total_steps=10, console=console)
    f = view.refresh()
    # Step 4: reward (2*4-8)/8 = 0, success 4/8, 8 samples per 2 s step; 6 steps left at 2 s each.
    assert (f["step"], f["total"], f["reward"], f["success"], f["samples_per_s"]) == (4, 10, 0.0, 0.5, 4.0)
    assert (f["eta_s"], f["eval_accuracy"], f["stale_mean"], f["stale_max"]) == (12.0, 0.4, 0.5, 1)
    console.print(view.progress.get_renderable())
    shown = buf.getvalue()
    for text in (
        "4/10",
        "ETA 0:00:12",
        "reward +0.000",
        "acc 0.500",
        "eval acc 0.400",
        "4.0 samples/s",
        "stale 0.50 (max 1)",
    ):
        assert text in shown, (text, shown)


def test_throughput_and_eta_average_the_last_ten_steps(tmp_path):
    _write_steps(tmp_path, range(1, 6), step_time_s=30.0)  # a slow start
    _write_steps(tmp_path, range(6, 16), step_time_s=1.0)
    f = RunProgress(str(tmp_path), total_steps=20, console=_terminal()[1]).refresh()
    assert f["samples_per_s"] == 8.0 and f["eta_s"] == 5.0


def test_bar_follows_the_file_as_it_grows_and_when_a_resumed_master_cuts_it(tmp_path):
    view = RunProgress(str(tmp_path), total_steps=10, console=_terminal()[1])
    assert view.refresh()["step"] == 0 and eta_text(view.refresh()["eta_s"]) == "ETA -:--:--"
    _write_steps(tmp_path, [1, 2, 3])
    assert view.refresh()["step"] == 3
    truncate_metrics(str(tmp_path / "metrics.jsonl"), last_step=2)  # resumed from step 2's checkpoint
    assert view.refresh()["step"] == 2
    _write_steps(tmp_path, [3])
    assert view.refresh()["step"] == 3


def test_tail_returns_only_whole_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2')  # the master is writing step 2
    tail = JsonlTail(str(path))
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as f:
        f.write("}\n")
    assert tail.read() == [{"step": 2}] and tail.read() == []


def test_no_bar_when_stdout_is_not_a_terminal_and_echoed_lines_pass_unchanged(tmp_path, capsys):
    _write_steps(tmp_path, [1])
    view = RunProgress(str(tmp_path), total_steps=10, console=Console(file=io.StringIO()))
    assert not view.live
    view.start()
    view.print_lines("step 1 v1 | reward +0.5 [x]\n")
    view.stop()
    assert capsys.readouterr().out == "step 1 v1 | reward +0.5 [x]\n"  # no bar, no markup eaten


def test_echoed_log_lines_scroll_above_the_live_bar(tmp_path):
    log = tmp_path / "master_worker-0.log"
    log.write_text("")
    buf, console = _terminal()
    view = RunProgress(str(tmp_path), total_steps=3, console=console, poll_interval=0.05)
    echo = LogEcho(write=view.print_lines)
    echo.add(str(log))
    assert view.live
    view.start()
    echo.start()
    try:
        _write_steps(tmp_path, [1, 2, 3])
        with open(log, "a") as f:
            f.write("step 3 v3 | reward +0.250 [worker line]\n")
    finally:
        echo.stop()  # drains the last lines
        view.stop()
    shown = buf.getvalue()
    assert "step 3 v3 | reward +0.250 [worker line]" in shown
    assert "3/3" in shown and "ETA 0:00:00" in shown  # the final state of the bar stays on screen
    assert shown.index("[worker line]") < shown.rindex("3/3")  # the line above the bar's last drawing


def test_the_launchers_own_log_lines_go_above_the_bar_while_it_is_drawn(tmp_path):
    import logging
    import sys

    buf, console = _terminal()
    handler = logging.StreamHandler(sys.stderr)  # as realhf.base.logging sets up the launcher
    logging.getLogger().addHandler(handler)
    try:
        view = RunProgress(str(tmp_path), total_steps=3, console=console).start()
        logging.getLogger("launcher").warning("generation_server/0 died; restart 1 in 2s")
        view.stop()
        assert handler.stream is sys.stderr  # given back when the bar is gone
    finally:
        logging.getLogger().removeHandler(handler)
    assert "generation_server/0 died; restart 1 in 2s" in buf.getvalue()
