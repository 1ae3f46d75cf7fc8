"""Evaluator worker: accuracy and pass@k of the published weights every N versions, while training
goes on (docs/architecture.md §2; launched only when exp_ctrl.eval_freq_steps = N > 0).

    configure: lower this process's CPU priority (nice +evaluation.during_nice) before anything
               else, so every thread it starts inherits it; load the held-out prompts, start a
               native engine in this process (no HTTP), open the metrics sinks
    loop:      every poll_interval s read model_version/<role>; a version due (a multiple of N)
               is taken at once: hard links into <run_dir>/evaluator/<v>/, so the trainer's
               pruning of published versions cannot pull it away (realhf.impl.eval_schedule).
               When no evaluation runs, evaluate the newest taken version in a thread (the loop
               stays free to take versions and to stop); older waiting ones are skipped and said
               so. Each result: one row in eval_metrics.jsonl (+ tensorboard / wandb), one log line
    exit:      stop the engine (an evaluation in progress ends at once, unrecorded: the run's end
               never waits for it), drop the taken versions, close the sinks

It holds nothing another worker needs, so the launcher restarts it by default; a restarted
evaluator carries on after the last version in eval_metrics.jsonl.
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
from realhf.impl.eval_schedule import EvalSchedule, Pick, release_version, take_version
from realhf.system.stats_logger import read_eval_metrics, truncate_metrics
from realhf.system.worker_base import Worker

# Under the run directory, beside published_weights/: the versions this evaluator has taken.
TAKEN_DIR = "evaluator"


class Evaluator(Worker):
    config_cls = EvaluatorConfig

    def _configure(self) -> None:
        cfg: EvaluatorConfig = self.config
        os.nice(cfg.nice)  # first: the engine's and the grader's threads and processes inherit it
        import torch

        from realhf.base.device import pick_device, why_device
        from realhf.impl.dataset.prompt_dataset import load_prompts
        from realhf.impl.environment.math_grader import MathGrader
        from realhf.impl.inference.batch_generate import engine_generate_fn
        from realhf.impl.inference.factory import create_engine_from_config
        from realhf.system.stats_logger import StatsLogger

        torch.set_num_threads(cfg.n_threads)
        self._engine = self._grader = self._sink = None
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

        self._rows = load_prompts(cfg.test_path, columns=cfg.columns, split=cfg.test_split)[: cfg.n_prompts]
        native = dataclasses.replace(cfg.native, n_threads=cfg.n_threads, max_running_requests=cfg.batch_size)
        device = pick_device(cfg.device)
        self.logger.info(f"evaluation engine on {device} ({why_device(cfg.device, device)})")
        self._engine = create_engine_from_config(
            cfg.model_path, native, seed=cfg.seed, name=self.name, device=device
        ).start()
        # Bounded: an engine that stopped answering fails this evaluation (and the worker, which restarts).
        self._generate = engine_generate_fn(self._engine, timeout=cfg.answer_timeout)
        self._grader = MathGrader(n_workers=1)
        self._sink = StatsLogger(
            cfg.metrics_path,
            cfg.stats.tensorboard_path,
            wandb_project=cfg.stats.wandb_project,
            wandb_run_name=cfg.wandb_run_name,
            wandb_mode=cfg.stats.wandb_mode,
            echo=False,
        )
        self.logger.info(
            f"evaluating every {cfg.eval_freq_steps} versions from version {self._schedule.evaluated}: "
            f"{len(self._rows)} prompts x {cfg.samples} answers at T={cfg.temperature:g}, "
            f"nice {os.nice(0)}, {cfg.n_threads} thread(s); rows to {cfg.metrics_path}"
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
        from realhf.impl.pass_at_k import accuracy_and_pass_at_k

        cfg = self.config
        self._engine.update_weights(str(self._taken / str(version)), weight_version=version)
        return accuracy_and_pass_at_k(
            cfg.model_path,
            self._rows,
            cfg.samples,
            temperature=cfg.temperature,
            max_new_tokens=cfg.max_new_tokens,
            generate_fn=self._generate,
            grader=self._grader,
            chat_template=cfg.chat_template,
        )

    def _record(self, pick: Pick, future: Future, started: float) -> None:
        result = future.result()  # an evaluation that raised fails the worker (it is restarted)
        seconds = time.monotonic() - started
        release_version(self._taken / str(pick.version))
        trainer = self._trainer_version()
        row = {
            "step": pick.version,
            "version": pick.version,
            "time": time.time(),
            "eval/accuracy": result["accuracy"],
            "eval/pass_at_k": result["pass_at_k"],
            "eval/k": result["k"],
            "eval/n_prompts": result["n_prompts"],
            "eval/temperature": result["temperature"],
            "eval/mean_new_tokens": result["mean_new_tokens"],
            "eval/truncated": result["truncated"],
            "eval/seconds": seconds,
            "eval/trainer_version": trainer,
            "eval/skipped": pick.skipped,
        }
        self._sink.log(row)
        self.logger.info(
            f"evaluated version {pick.version} (step {pick.version}): accuracy {result['accuracy']:.3f}, "
            f"pass@{result['k']} {result['pass_at_k']:.3f} on {result['n_prompts']} prompts x "
            f"{result['k']} at T={result['temperature']:g} in {seconds:.1f}s (trainer now at version "
            f"{trainer})" + (f"; skipped {pick.skipped}" if pick.skipped else "")
        )

    def _exit_hook(self) -> None:
        if getattr(self, "_engine", None) is not None:
            self._engine.stop(timeout=2.0)  # an evaluation in progress ends now (GenerationInterrupted)
        if getattr(self, "_running", None) is not None:
            pick = self._running[0]
            self.logger.info(f"stopping: the evaluation of version {pick.version} is abandoned, not recorded")
        if getattr(self, "_grader", None) is not None:
            self._grader.close()
        if getattr(self, "_sink", None) is not None:
            self._sink.close()
        if getattr(self, "_taken", None) is not None:
            shutil.rmtree(self._taken, ignore_errors=True)
