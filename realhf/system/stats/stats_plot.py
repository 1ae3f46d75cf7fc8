"""The reward and accuracy curves of a finished run as one PNG: `<log_dir>/curves.png`.

Drawn at the end of a run beside the text curves of the final report: the mean reward per step
(top), the training success rate per step and the evaluator's sampled accuracy when it ran
(bottom), each per-step series with its moving average. matplotlib's object API on the Agg
canvas: no display, no pyplot state. A plot that fails costs one warning line, never the run.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Sequence

from realhf.base import logging

logger = logging.getLogger("stats_plot")

CURVES_PNG = "curves.png"


def moving_average(xs: Sequence[float], window: int) -> List[float]:
    """Mean of the last `window` values at each point (fewer at the start)."""
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= window:
            total -= xs[i - window]
        out.append(total / min(i + 1, window))
    return out


class _Preload:
    thread: Optional[threading.Thread] = None


def preload_in_background() -> None:
    """Import matplotlib now, in a daemon thread at the lowest CPU priority: it takes ≈ 0.4 s of
    CPU, which the report at the end of a run would otherwise wait for, and a training run leaves
    idle moments to do it in. Once per process; `save_curves_png` imports it as before."""
    if _Preload.thread is not None:
        return

    def load() -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (AttributeError, OSError):
            pass
        try:
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.figure  # noqa: F401
        except Exception:  # noqa: BLE001 - save_curves_png reports a broken matplotlib
            pass

    _Preload.thread = threading.Thread(target=load, name="preload-matplotlib", daemon=True)
    _Preload.thread.start()


def save_curves_png(metrics: List[Dict[str, Any]], evals: List[Dict[str, Any]], path: str) -> str:
    """Draw the curves of metrics.jsonl rows (and eval_metrics.jsonl rows) into `path`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = [m["step"] for m in metrics]
    window = max(1, len(metrics) // 20)
    fig = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    reward_ax, acc_ax = fig.subplots(2, 1, sharex=True)
    rewards = [m["reward_mean"] for m in metrics]
    if window > 1:
        reward_ax.plot(steps, rewards, color="tab:blue", alpha=0.3, linewidth=1, label="per step")
        reward_ax.plot(steps, moving_average(rewards, window), color="tab:blue", label=f"mean of {window} steps")
    else:  # a short run: the per-step line is its own average
        reward_ax.plot(steps, rewards, color="tab:blue", label="per step")
    reward_ax.set_ylabel("reward")
    reward_ax.set_title("reward and accuracy during training")
    reward_ax.legend(loc="lower right")
    success = [m["success_rate"] for m in metrics]
    if window > 1:
        acc_ax.plot(steps, success, color="tab:green", alpha=0.3, linewidth=1)
    acc_ax.plot(steps, moving_average(success, window), color="tab:green", label="training success rate")
    if evals:
        acc_ax.plot(
            [e["step"] for e in evals],
            [e["eval/accuracy"] for e in evals],
            "o-",
            color="tab:red",
            label=f"held-out accuracy (T = {evals[-1].get('eval/temperature', '?')})",
        )
    acc_ax.set_ylim(0, 1)
    acc_ax.set_xlabel("train step (= weight version)")
    acc_ax.set_ylabel("accuracy")
    acc_ax.legend(loc="lower right")
    fig.savefig(path, format="png")
    return path


def write_curves_png(log_dir: str, metrics: List[Dict[str, Any]], evals: List[Dict[str, Any]]) -> Optional[str]:
    """`<log_dir>/curves.png`, or None (and one warning line) when there is nothing to draw or
    drawing fails."""
    path = os.path.join(log_dir, CURVES_PNG)
    if not metrics:
        return None
    try:
        return save_curves_png(metrics, evals, path)
    except Exception as e:  # a plot is a nicety: the run's results are in metrics.jsonl anyway
        logger.warning(f"could not save the curves to {path}: {type(e).__name__}: {e}")
        return None
