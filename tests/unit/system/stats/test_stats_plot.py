"""The curves PNG of a finished run: drawn from a real metrics.jsonl (and eval_metrics.jsonl) at
<log_dir>/curves.png, a valid image; a failing plot costs one warning line, not the run."""

import json
import logging

from PIL import Image

from realhf.base.trial_files import read_metrics
from realhf.system.stats.stats_logger import EVAL_METRICS_FILE, StatsLogger, read_eval_metrics, step_metrics
from realhf.system.stats.stats_plot import CURVES_PNG, moving_average, write_curves_png


def _write_run(log_dir, n_steps=30):
    stats = StatsLogger(str(log_dir / "metrics.jsonl"), echo=False)
    for step in range(1, n_steps + 1):
        n_success = min(8, step // 4)
        batch = {
            "n_groups": 2,
            "n_samples": 8,
            "reward_sum": 2.0 * n_success - 8,
            "n_success": n_success,
            "n_groups_no_spread": 0,
            "n_no_eos": 0,
            "gen_tokens": 80,
            "head_offpolicyness": [1],
            "tail_offpolicyness": [0],
        }
        stats.log(
            step_metrics(
                step,
                step,
                [{"batch": batch}],
                [{"version": step, "stats": {"loss": 0.1}}],
                {},
                stale_dropped=0,
                step_time_s=1.0,
                wait_time_s=0.0,
                training_samples=2 * step,
            )
        )
    stats.close()
    with open(log_dir / EVAL_METRICS_FILE, "w") as f:
        for v, acc in ((10, 0.3), (20, 0.45), (30, 0.6)):
            f.write(json.dumps({"step": v, "version": v, "eval/accuracy": acc, "eval/temperature": 1.0}) + "\n")


def test_curves_png_is_written_in_the_log_dir_from_the_runs_metrics(tmp_path):
    _write_run(tmp_path)
    path = write_curves_png(str(tmp_path), read_metrics(str(tmp_path)), read_eval_metrics(str(tmp_path)))
    assert path == str(tmp_path / CURVES_PNG)
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (800, 600)
        img.load()  # the whole image decodes
        # Not a blank canvas: the curves put many colours on it.
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 50


def test_a_failing_plot_is_one_warning_and_no_png(tmp_path, caplog):
    _write_run(tmp_path, n_steps=3)
    (tmp_path / CURVES_PNG).mkdir()  # the PNG's path is taken by a directory: savefig raises
    with caplog.at_level(logging.WARNING):
        assert write_curves_png(str(tmp_path), read_metrics(str(tmp_path)), []) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not save the curves" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()


def test_nothing_to_draw_before_the_first_step(tmp_path):
    assert write_curves_png(str(tmp_path), [], []) is None and not (tmp_path / CURVES_PNG).exists()


def test_moving_average_uses_the_values_so_far_at_the_start():
    assert moving_average([1, 2, 3, 4, 5], 2) == [1.0, 1.5, 2.5, 3.5, 4.5]


def test_the_plotting_library_preloads_once_in_an_idle_priority_thread(monkeypatch):
    import os
    import sys

    from realhf.system.stats import stats_plot

    niced, before = [], os.getpriority(os.PRIO_PROCESS, 0)
    real_setpriority = os.setpriority
    monkeypatch.setattr(
        os, "setpriority", lambda which, who, prio: (niced.append((who, prio)), real_setpriority(which, who, prio))
    )
    monkeypatch.setattr(stats_plot._Preload, "thread", None)
    stats_plot.preload_in_background()
    first = stats_plot._Preload.thread
    stats_plot.preload_in_background()  # a second launch (a restarted trial) starts no second thread
    assert stats_plot._Preload.thread is first
    first.join(timeout=60)
    assert not first.is_alive() and "matplotlib.figure" in sys.modules
    # Only the loading thread was niced, not the launcher: its own id, not the process's 0.
    assert niced == [(first.native_id, 19)] and first.native_id != os.getpid()
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
