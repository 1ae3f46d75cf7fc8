"""Evaluator worker: the task's success rate, mean reward and pass@k of the published weights
every N versions, while training goes on (docs/architecture.md §2; launched only when
exp_ctrl.eval_freq_steps = N > 0). The episodes are the task's own: the configured agent and
environment on the held-out rows (realhf.system.evaluator.task_eval).

    configure: lower this process's CPU priority (nice +evaluation.during_nice) before anything
               else, so every thread it starts inherits it; load the held-out prompts, start a
               native engine in this process (no HTTP), open the metrics sinks
    loop:      every poll_interval s read model_version/<role>; a version due (a multiple of N)
               is taken at once: hard links into <run_dir>/evaluator/<v>/, so the trainer's
               pruning of published versions cannot pull it away (realhf.system.evaluator.eval_schedule).
               When no evaluation runs, evaluate the newest taken version in a thread (the loop
               stays free to take versions and to stop); older waiting ones are skipped and said
               so. Each result: one row in eval_metrics.jsonl (+ tensorboard / wandb), one log line
    exit:      stop the engine (an evaluation in progress ends at once, unrecorded: the run's end
               never waits for it), drop the taken versions, close the sinks

It holds nothing another worker needs, so the launcher restarts it by default; a restarted
evaluator carries on after the last version in eval_metrics.jsonl. The run's end does not wait
for it: the last trained version, when it was not evaluated here, is evaluated by the launcher
after every worker stopped (`evaluate_final_version`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Optional, Tuple

from realhf.api.worker_configs import EvaluatorConfig
from realhf.base import name_resolve, names, trial_files
from realhf.system.evaluator.eval_schedule import EvalSchedule, Pick, release_version, take_version
from realhf.system.stats.stats_logger import read_eval_metrics, truncate_metrics
from realhf.system.worker_base import Worker

# Under the run directory, beside published_weights/: the versions this evaluator has taken.
TAKEN_DIR = "evaluator"


class Evaluator(Worker):
    config_cls = EvaluatorConfig

    def _configure(self) -> None:
        cfg: EvaluatorConfig = self.config
        os.nice(cfg.nice)  # first: the engine's and the environment's threads and processes inherit it
        import torch

        from realhf.base.device import pick_device, why_device
        from realhf.impl.inference.factory import create_engine_from_config
        from realhf.system.evaluator.task_eval import TaskEval, load_eval_rows

        torch.set_num_threads(cfg.n_threads)
        self._engine = self._task = self._sink = None
        self._running: Optional[Tuple[Pick, Future, float]] = None
        self._version_key = names.model_version(self.ctx.experiment_name, self.ctx.trial_name, cfg.model_role)
        self._published = trial_files.published_weights_dir(cfg.run_dir, cfg.model_role)
        self._taken = Path(cfg.run_dir) / TAKEN_DIR
        shutil.rmtree(self._taken, ignore_errors=True)  # links of an earlier incarnation
        self._taken.mkdir(parents=True)

        # A resumed run trains the versions after its checkpoint again: their old rows go. (At a
        # resume the trainer has not republished its version yet; at a restart it is ahead.)
        truncate_metrics(cfg.metrics_path, max(cfg.resumed_version, self._trainer_version()))
        done = read_eval_metrics(os.path.dirname(cfg.metrics_path))
        self._schedule = EvalSchedule(cfg.eval_freq_steps, evaluated=done[-1]["step"] if done else 0)

        rows = load_eval_rows(cfg, cfg.n_prompts)
        native = dataclasses.replace(cfg.native, n_threads=cfg.n_threads, max_running_requests=cfg.batch_size)
        device = pick_device(cfg.device)
        self.logger.info(f"evaluation engine on {device} ({why_device(cfg.device, device)})")
        self._engine = create_engine_from_config(
            cfg.model_path, native, seed=cfg.seed, name=self.name, device=device
        ).start()
        self._task = TaskEval(cfg, self._engine, rows)
        self._sink = eval_sink(cfg)
        self.logger.info(
            f"evaluating every {cfg.eval_freq_steps} versions from version {self._schedule.evaluated}: "
            f"agent {cfg.agent.type}, env {cfg.env.type} on {len(rows)} held-out prompts x {cfg.samples} "
            f"answers at T={cfg.temperature:g}, nice {os.nice(0)}, {cfg.n_threads} thread(s); rows to {cfg.metrics_path}"
        )

    def _trainer_version(self) -> int:
        try:
            return int(name_resolve.get(self._version_key))
        except name_resolve.NameEntryNotFoundError:
            return 0  # the trainer has not started yet

    # ---- the loop ---------------------------------------------------------------------------
    def _poll(self) -> bool:
        self._take_due_version()
        if self._running is not None and self._running[1].done():
            self._record(*self._running)
            self._running = None
        if self._running is None:
            pick = self._schedule.next()
            if pick is not None:
                self._start(pick)
        time.sleep(self.config.poll_interval)
        return True

    def _take_due_version(self) -> None:
        version = self._schedule.to_take(self._trainer_version())
        if version is None:
            return
        ok = take_version(self._published / str(version), self._taken / str(version))
        self._schedule.took(version, ok)
        if not ok:
            self.logger.warning(f"version {version} was pruned by the trainer before it could be taken; skipped")

    def _start(self, pick: Pick) -> None:
        for version in pick.release:
            release_version(self._taken / str(version))
        if pick.skipped:
            # Due while an evaluation ran, while this evaluator was (re)starting, or pruned first.
            self.logger.info(
                f"skipping versions {pick.skipped}: evaluating the newest due one, {pick.version}, "
                "instead (evaluations never queue behind training)"
            )
        future: Future = Future()

        def evaluate():
            try:
                future.set_result(self._evaluate(pick.version))
            except BaseException as e:  # noqa: BLE001 - handed to the loop, which fails the worker
                future.set_exception(e)

        # A daemon thread: an evaluation still running at exit must not hold the process.
        threading.Thread(target=evaluate, name=f"evaluate-v{pick.version}", daemon=True).start()
        self._running = (pick, future, time.monotonic())

    def _evaluate(self, version: int) -> dict:
        cfg = self.config
        self._engine.update_weights(str(self._taken / str(version)), weight_version=version)
        return self._task.run(cfg.temperature, cfg.samples)

    def _record(self, pick: Pick, future: Future, started: float) -> None:
        from realhf.system.evaluator.task_eval import eval_line, eval_row

        result = future.result()  # an evaluation that raised fails the worker (it is restarted)
        seconds = time.monotonic() - started
        release_version(self._taken / str(pick.version))
        row = eval_row(pick.version, result, seconds, self._trainer_version(), pick.skipped)
        self._sink.log(row)
        self.logger.info(eval_line(row))

    def _exit_hook(self) -> None:
        if getattr(self, "_engine", None) is not None:
            self._engine.stop(timeout=2.0)  # an evaluation in progress ends now (GenerationInterrupted)
        if getattr(self, "_running", None) is not None:
            pick = self._running[0]
            self.logger.info(f"stopping: the evaluation of version {pick.version} is abandoned, not recorded")
        if getattr(self, "_task", None) is not None:
            self._task.close()  # the environment's shared part (a grader pool, a sandbox)
        if getattr(self, "_sink", None) is not None:
            self._sink.close()
        if getattr(self, "_taken", None) is not None:
            shutil.rmtree(self._taken, ignore_errors=True)


def evaluate_final_version(cfg: EvaluatorConfig, weights: str, version: int) -> Optional[dict]:
    """The last trained version, evaluated as the evaluator evaluates a due one, when its row is not
    in eval_metrics.jsonl yet: it is not a multiple of N, or its evaluation was still running when
    the run ended (the run's end never waits for the evaluator). Run by the launcher after every
    worker stopped; returns the row written, or None when there was nothing to do."""
    from realhf.system.evaluator.task_eval import eval_row, evaluate_weights

    done = read_eval_metrics(os.path.dirname(cfg.metrics_path))
    if any(r["version"] == version for r in done) or version <= 0:
        return None
    schedule = EvalSchedule(cfg.eval_freq_steps, evaluated=done[-1]["step"] if done else 0)
    schedule.took(version, ok=True)
    pick = schedule.next()
    started = time.monotonic()
    (result,) = evaluate_weights(cfg, weights, [(cfg.temperature, cfg.samples)], cfg.n_prompts)
    row = eval_row(version, result, time.monotonic() - started, version, pick.skipped)
    sink = eval_sink(cfg)
    try:
        sink.log(row)
    finally:
        sink.close()
    return row


def eval_sink(cfg: EvaluatorConfig):
    """The evaluations' sinks: eval_metrics.jsonl, and tensorboard / wandb when configured."""
    from realhf.system.stats.stats_logger import StatsLogger

    return StatsLogger(
        cfg.metrics_path,
        cfg.stats.tensorboard_path,
        wandb_project=cfg.stats.wandb_project,
        wandb_run_name=cfg.wandb_run_name,
        wandb_mode=cfg.stats.wandb_mode,
        echo=False,
    )
