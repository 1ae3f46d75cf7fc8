"""Per-step training metrics: computed from the model workers' replies, written several ways.

`step_metrics(...)` turns one step's replies into a flat dict of numbers; `StatsLogger` prints
it as one console line (rich), appends it as one JSON object to `metrics.jsonl`, and, when
configured, writes it to tensorboard and wandb (the run's config attached) and serves it as
Prometheus gauges (realhf/system/stats/stats_prometheus.py). With `stats.log_completions`, a few of the
step's samples follow its line (`echo_lines`) and go to `completions.jsonl` (`CompletionsLog`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console

# Console line: (metrics key, label, format).
_CONSOLE_FIELDS = (
    ("reward_mean", "reward", "{:+.3f}"),
    ("success_rate", "success", "{:.3f}"),
    ("frac_reward_zero_std", "no_spread", "{:.2f}"),
    ("head_offpolicyness_mean", "head_stale", "{:.2f}"),
    ("head_offpolicyness_max", "/max", "{:d}"),
    ("tail_offpolicyness_mean", "tail_stale", "{:.2f}"),
    ("tail_offpolicyness_max", "/max", "{:d}"),
    ("stale_dropped", "dropped", "{:d}"),
    ("samples_per_s", "samples/s", "{:.1f}"),
    ("gen_tokens_per_s", "gen_tok/s", "{:.0f}"),
    ("step_time_s", "step", "{:.2f}s"),
    ("wait_time_s", "wait", "{:.2f}s"),
    ("loss", "loss", "{:+.4f}"),
    ("clip_fraction", "clip", "{:.3f}"),
    ("importance_ratio", "ratio", "{:.3f}"),
    ("grad_norm", "grad_norm", "{:.3f}"),
)


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs)) / len(xs) if xs else 0.0


def step_metrics(
    step: int,
    version: int,
    fetch_replies: List[Dict[str, Any]],
    train_replies: List[Dict[str, Any]],
    inference_replies: Dict[str, List[Dict[str, Any]]],
    stale_dropped: int,
    step_time_s: float,
    wait_time_s: float,
    training_samples: int,
    agent_extremes: Sequence[str] = (),
) -> Dict[str, Any]:
    """Merge the DP ranks' replies of one step into the logged metrics. `agent_extremes`: the
    agent numbers (Outcome.info names, or "*" for all) also logged as `agent/<name>_min`/`_max`."""
    batches = [r["batch"] for r in fetch_replies]
    n_samples = sum(b["n_samples"] for b in batches)
    gen_tokens = sum(b["gen_tokens"] for b in batches)
    head = [h for b in batches for h in b["head_offpolicyness"]]
    tail = [t for b in batches for t in b["tail_offpolicyness"]]
    step_time_s = max(step_time_s, 1e-9)
    m: Dict[str, Any] = {
        "step": step,
        "version": version,
        "reward_mean": sum(b["reward_sum"] for b in batches) / max(n_samples, 1),
        "success_rate": sum(b["n_success"] for b in batches) / max(n_samples, 1),
        "no_eos_rate": sum(b["n_no_eos"] for b in batches) / max(n_samples, 1),
        "head_offpolicyness_mean": _mean(head),
        "head_offpolicyness_max": max(head, default=0),
        "tail_offpolicyness_mean": _mean(tail),
        "tail_offpolicyness_max": max(tail, default=0),
        "stale_dropped": int(stale_dropped),
        "training_samples": int(training_samples),
        "n_groups": sum(b["n_groups"] for b in batches),
        "frac_reward_zero_std": sum(b["n_groups_no_spread"] for b in batches)
        / max(sum(b["n_groups"] for b in batches), 1),
        "n_samples": n_samples,
        "gen_tokens": gen_tokens,
        "samples_per_s": n_samples / step_time_s,
        "gen_tokens_per_s": gen_tokens / step_time_s,
        "step_time_s": step_time_s,
        "wait_time_s": wait_time_s,
        "train_time_s": max((r.get("train_time_s", 0.0) for r in train_replies), default=0.0),
        "publish_time_s": max((r.get("publish_time_s", 0.0) for r in train_replies), default=0.0),
    }
    # The agents' own numbers: the mean over the samples that reported each (Outcome.info), and
    # the extremes of those named in stats.agent_metric_extremes.
    merged: Dict[str, List[float]] = {}
    for b in batches:
        for k, (total, n, low, high) in b.get("agent_metrics", {}).items():
            acc = merged.get(k)
            if acc is None:
                merged[k] = [total, n, low, high]
            else:
                acc[0], acc[1], acc[2], acc[3] = acc[0] + total, acc[1] + n, min(acc[2], low), max(acc[3], high)
    for k, (total, n, low, high) in sorted(merged.items()):
        m[f"agent/{k}"] = total / max(n, 1)
        if k in agent_extremes or "*" in agent_extremes:
            m[f"agent/{k}_min"], m[f"agent/{k}_max"] = low, high
    # Train stats are already global (all-reduced) and identical on every rank.
    if train_replies:
        for k, v in train_replies[0].get("stats", {}).items():
            m[k] = float(v)
    for role, replies in inference_replies.items():
        n = sum(r["n_tokens"] for r in replies)
        for key in ("behav_abs_diff", "value_mean"):  # log-prob models / the critic
            if n and key in replies[0]:
                m[f"{role}_inf_{key}"] = sum(r[key] * r["n_tokens"] for r in replies) / n
    return m


def format_line(m: Dict[str, Any]) -> str:
    parts = [f"[bold]step {m['step']}[/bold] v{m['version']}"]
    for key, label, fmt in _CONSOLE_FIELDS:
        if key in m and isinstance(m[key], (int, float)) and math.isfinite(m[key]):
            value = int(m[key]) if fmt.endswith("d}") else m[key]
            parts.append(f"{label} {fmt.format(value)}")
    return " | ".join(parts)


def truncate_metrics(path: str, last_step: int) -> int:
    """Keep only the lines of `path` with step <= last_step (atomically); returns how many remain.

    A run resumed from the checkpoint of step k repeats steps k+1…: their earlier lines would
    make the curve show two different step k+1s."""
    if not os.path.isfile(path):
        return 0
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    kept = []
    for line in lines:
        try:
            if int(json.loads(line)["step"]) <= last_step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by a crash
    if len(kept) != len(lines):
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(kept)
        os.replace(tmp, path)
    return len(kept)


class NoSpreadWatch:
    """Says so, once, when a run cannot learn: the fraction of groups whose rewards are all
    equal (`frac_reward_zero_std`, their advantages 0) stays at or above `threshold` for
    `patience` steps in a row. Steps after a warning start a new count; a step with spread ends
    the stretch."""

    def __init__(self, threshold: float = 0.9, patience: int = 10):
        self.threshold, self.patience = threshold, patience
        self.run, self.warned = 0, False

    def check(self, m: Dict[str, Any]) -> Optional[str]:
        frac = m.get("frac_reward_zero_std")
        if not isinstance(frac, (int, float)):
            return None
        self.run = self.run + 1 if frac >= self.threshold else 0
        if self.run < self.patience or self.warned:
            return None
        self.warned = True
        return (
            f"the last {self.run} steps learnt (almost) nothing: in {frac:.0%} of this step's groups every sample "
            f"got the same reward ({m.get('reward_mean', float('nan')):+.3f} mean), so their advantages are 0. "
            "Likely: the model never (or always) solves the task (try a stronger model, e.g. actor.path=<an HF "
            "model directory>, or an easier task), or the reward is constant (check your reward function or "
            "environment). frac_reward_zero_std is in metrics.jsonl."
        )


class StatsLogger:
    def __init__(
        self,
        metrics_path: str,
        tensorboard_path: str = "",
        console: Optional[Console] = None,
        wandb_project: str = "",
        wandb_run_name: str = "",
        wandb_mode: str = "offline",
        echo: bool = True,
        wandb_config: Optional[Dict[str, Any]] = None,
        prometheus_port: int = 0,
        prometheus_host: str = "127.0.0.1",
    ):
        os.makedirs(os.path.dirname(os.path.abspath(metrics_path)), exist_ok=True)
        self.metrics_path = metrics_path
        self.echo = echo  # the train-step console line; the evaluator logs a line of its own
        self._file = open(metrics_path, "a", buffering=1)  # one line per step, flushed per line
        # Worker stdout is a log file: no colours, no wrapping, one line per step.
        self._console = console or Console(highlight=False, soft_wrap=True)
        self._tb = None
        if tensorboard_path:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(tensorboard_path)
        self._wandb = None
        if wandb_project:
            try:
                import wandb  # optional extra: pip install 'realhf[wandb]'
            except ImportError:
                raise RuntimeError(
                    "wandb_project is set but wandb is not installed: pip install 'realhf[wandb]' "
                    "or leave wandb_project empty"
                ) from None
            self._wandb = wandb.init(
                project=wandb_project,
                name=wandb_run_name or None,
                mode=wandb_mode,
                dir=os.path.dirname(os.path.abspath(metrics_path)),
                config=wandb_config or {},
            )
        self._prometheus = None
        if prometheus_port:
            from realhf.system.stats.stats_prometheus import TrainingMetricsServer

            # The evaluator writes its rows beside metrics.jsonl; the endpoint shows the latest.
            eval_path = os.path.join(os.path.dirname(os.path.abspath(metrics_path)), EVAL_METRICS_FILE)
            self._prometheus = TrainingMetricsServer(prometheus_host, prometheus_port, eval_path)
        self.prometheus_url = self._prometheus.url if self._prometheus is not None else ""
        self._no_spread = NoSpreadWatch()

    def log(self, m: Dict[str, Any]) -> None:
        if self.echo:
            self._console.print(format_line(m))
        warning = self._no_spread.check(m)
        if warning:  # printed whether or not the step lines are, since the user must see it
            self._console.print(f"[bold yellow]warning:[/bold yellow] {warning}")
        self._file.write(json.dumps(m, sort_keys=False) + "\n")
        if self._tb is not None:
            for k, v in m.items():
                if k != "step" and isinstance(v, (int, float)):
                    self._tb.add_scalar(k, v, m["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in m.items() if isinstance(v, (int, float))}, step=m["step"])
        if self._prometheus is not None:
            self._prometheus.collector.update(m)

    def echo_lines(self, lines: Sequence[str]) -> None:
        """Plain lines under the step's line (the logged completions): their text is the model's,
        so rich must not read `[...]` as markup or `:name:` as an emoji."""
        if self.echo:
            for line in lines:
                self._console.print(line, markup=False, emoji=False, highlight=False)

    def close(self) -> None:
        self._file.close()
        if self._prometheus is not None:
            self._prometheus.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


TRAINED_QIDS_FILE = "trained_qids.jsonl"
# Beside metrics.jsonl, so that its readers (one row per train step) stay as they are: one row
# per evaluation during training (realhf/system/evaluator/evaluator_worker.py), keyed by "step" = version.
EVAL_METRICS_FILE = "eval_metrics.jsonl"


def read_eval_metrics(log_dir: str) -> List[Dict[str, Any]]:
    """The rows of `<log_dir>/eval_metrics.jsonl`, by version ([] when nothing was evaluated); a
    last line cut short by a killed evaluator is left out."""
    path = os.path.join(log_dir, EVAL_METRICS_FILE)
    rows = []
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    continue
    return sorted(rows, key=lambda r: r["step"])


class CompletionsLog:
    """`<log_dir>/completions.jsonl`: the rows of realhf.system.stats.completion_log, one line each with
    `step` first (stats.log_completions). Lines of steps after `last_step` (a resumed run repeats
    them) are dropped on open, like metrics.jsonl's."""

    def __init__(self, path: str, last_step: int):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        truncate_metrics(path, last_step)
        self.path = path
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # the model's text, unescaped

    def write(self, step: int, rows: Sequence[Dict[str, Any]]) -> None:
        for row in rows:
            self._file.write(json.dumps({"step": int(step), **row}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()


class TrainedQidsLog:
    """`<log_dir>/trained_qids.jsonl`: one `{"step": k, "qids": [...]}` line per train step, the
    prompt groups that step trained. Lines of steps after `last_step` (a resumed run repeats
    them) are dropped on open, like metrics.jsonl's."""

    def __init__(self, path: str, last_step: int):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        truncate_metrics(path, last_step)
        self.path = path
        self._file = open(path, "a", buffering=1)

    def write(self, step: int, qids: List[str]) -> None:
        self._file.write(json.dumps({"step": int(step), "qids": list(qids)}) + "\n")

    def close(self) -> None:
        self._file.close()
