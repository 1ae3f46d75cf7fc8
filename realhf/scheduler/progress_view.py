"""The launcher's live view of a run: a rich progress bar below the echoed worker log lines.

    train ━━━━━━━━━━━╸━━━━━━━━  42/350 ETA 0:05:51 reward +0.125 | acc 0.531 | eval acc 0.480 | 111.2 samples/s | stale 1.38 (max 4)

The bar reads what the run already writes — the master's metrics.jsonl (one flushed line per
step) and the evaluator's eval_metrics.jsonl — so it needs no channel of its own. It is drawn
only when stdout is a terminal (stats.progress_bar); elsewhere (CI, pipes, `| tee`) the echoed
lines are written as they are and nothing else. While it is drawn, every echoed line and the
launcher's own log lines go through the same rich Console, so they scroll above the bar.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from realhf.base.trial_files import metrics_path
from realhf.system.stats.stats_logger import EVAL_METRICS_FILE

# samples/s and the ETA average the last steps: the first steps (model loading, the first
# weights) would otherwise weigh on the estimate for the whole run.
RECENT_STEPS = 10


def progress_fields(rows: List[Dict[str, Any]], evals: List[Dict[str, Any]], total_steps: int) -> Dict[str, Any]:
    """What the bar shows, from metrics.jsonl rows and eval_metrics.jsonl rows (None: not known yet)."""
    last = rows[-1] if rows else {}
    recent = rows[-RECENT_STEPS:]
    step_s = sum(r.get("step_time_s", 0.0) for r in recent)
    step = int(last.get("step", 0))
    return {
        "step": step,
        "total": total_steps,
        "eta_s": max(total_steps - step, 0) * step_s / len(recent) if recent else None,
        "reward": last.get("reward_mean"),
        "success": last.get("success_rate"),
        "eval_accuracy": evals[-1].get("eval/accuracy") if evals else None,
        "samples_per_s": sum(r.get("n_samples", 0) for r in recent) / step_s if step_s > 0 else None,
        "stale_mean": last.get("head_offpolicyness_mean"),
        "stale_max": last.get("head_offpolicyness_max"),
    }


def eta_text(eta_s: Optional[float]) -> str:
    if eta_s is None:
        return "ETA -:--:--"
    s = int(round(eta_s))
    return f"ETA {s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def stats_text(f: Dict[str, Any]) -> str:
    """The numbers after the bar, those not known yet left out."""
    parts = []
    if f["reward"] is not None:
        parts.append(f"reward {f['reward']:+.3f}")
    if f["success"] is not None:
        parts.append(f"acc {f['success']:.3f}")
    if f["eval_accuracy"] is not None:
        parts.append(f"eval acc {f['eval_accuracy']:.3f}")
    if f["samples_per_s"] is not None:
        parts.append(f"{f['samples_per_s']:.1f} samples/s")
    if f["stale_mean"] is not None:
        parts.append(f"stale {f['stale_mean']:.2f} (max {f['stale_max']})")
    return " | ".join(parts) if parts else "waiting for the first step"


class JsonlTail:
    """The rows appended to a JSONL file since the last `read()`: whole lines only (a line being
    written waits for the next read), unparsable ones skipped. A file replaced by a new one (a
    resumed master cuts metrics.jsonl to its checkpoint's step) is read again from its start."""

    def __init__(self, path: str):
        self.path = path
        self._offset = 0
        self._inode = None

    def read(self) -> List[Dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:
                    self._inode, self._offset = st.st_ino, 0
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        cut = data.rfind(b"\n") + 1
        self._offset += cut
        rows = []
        for line in data[:cut].splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
        return rows


def make_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[eta]}"),
        TextColumn("{task.fields[stats]}"), console=console, refresh_per_second=4,
    )  # fmt: skip


class RunProgress:
    """The bar of one trial (`<log_dir>/metrics.jsonl` growing to `total_steps` rows) and the
    sink of the launcher's echoed log lines (`print_lines`)."""

    def __init__(
        self,
        log_dir: str,
        total_steps: int,
        enabled: bool = True,
        console: Optional[Console] = None,
        poll_interval: float = 0.5,
    ):
        self.console = console or Console(highlight=False)
        self.total_steps = total_steps
        self.live = enabled and self.console.is_terminal and not self.console.is_dumb_terminal
        self._metrics = JsonlTail(metrics_path(log_dir))
        self._evals = JsonlTail(os.path.join(log_dir, EVAL_METRICS_FILE))
        self._rows: List[Dict[str, Any]] = []
        self._eval_rows: List[Dict[str, Any]] = []
        self._poll_interval = poll_interval
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._handlers: List[tuple] = []
        self.progress = make_progress(self.console)
        self._task = self.progress.add_task(
            "train", total=total_steps, eta=eta_text(None), stats=stats_text(progress_fields([], [], total_steps))
        )

    def refresh(self) -> Dict[str, Any]:
        """Read what the files gained and update the bar; returns the fields shown."""
        # Read again from the start (a resumed run), a row replaces those of its step and later ones.
        for row in self._metrics.read():
            self._rows = [r for r in self._rows if r.get("step", 0) < row.get("step", 0)][-RECENT_STEPS:] + [row]
        self._eval_rows = (self._eval_rows + self._evals.read())[-1:]
        fields = progress_fields(self._rows, self._eval_rows, self.total_steps)
        self.progress.update(
            self._task, completed=fields["step"], eta=eta_text(fields["eta_s"]), stats=stats_text(fields)
        )
        return fields

    def print_lines(self, text: str) -> None:
        """Echoed worker log lines: above the bar while it is drawn, else written as they are."""
        if self.live:
            self.console.print(Text(text.rstrip("\n")), soft_wrap=True)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    def start(self) -> "RunProgress":
        if not self.live:
            return self
        streams = (sys.stdout, sys.stderr)
        self.progress.start()  # from here on sys.stdout/sys.stderr print through the console
        for h in logging.getLogger().handlers:
            if isinstance(h, logging.StreamHandler) and h.stream in streams:
                self._handlers.append((h, h.setStream(sys.stderr)))
        self._thread = threading.Thread(target=self._poll, name="progress-view", daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_interval):
            self.refresh()

    def stop(self) -> None:
        """Leave the last state of the bar on screen (above the final report)."""
        if not self.live or self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        self.refresh()
        for h, stream in self._handlers:
            h.setStream(stream)
        self._handlers.clear()
        self.progress.stop()
