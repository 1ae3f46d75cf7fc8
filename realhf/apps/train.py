"""Asynchronous PPO on the configured task (math prompts by default), the training command:
`realhf-train [key=value ...]` (the console script setup.py installs), `python -m realhf.apps.train [key=value ...]`, or, in a
checkout, `python training/main_async_ppo.py [key=value ...]`; all three run `cli` here, from any
working directory.

Defaults come from training/configs/async-ppo.yaml (realhf.base.package_files finds it: the
checkout's, or the installed package's copy; the schema is realhf.api.cli_args.AsyncPPOConfig;
`--help` lists every field). Its relative assets/... paths that are not in the working directory
name realhf's own copies (file_validation.use_packaged_files). The run:

  1. checks the config (a bad value fails here, naming the field, before any process starts);
  2. measures greedy and sampled accuracy of the initial model on held-out prompts: the success
     rate of the task's own agent and environment (realhf/system/evaluator/task_eval.py);
  3. launches Redis, the generation servers, the manager, rollout workers, model workers and the
     master (and the evaluator, with exp_ctrl.eval_freq_steps > 0), and supervises them until the
     master marks the trial COMPLETE (or anything fails);
  4. prints the reward curve, evaluates the last version if the evaluator did not, prints the
     accuracy curve of the evaluations during training (if any) and the accuracy of the last
     published weights, and saves the curves as <log dir>/curves.png.

While it runs, a progress bar (realhf/scheduler/progress_view.py) sits below the master's
echoed lines when stdout is a terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import hydra
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from realhf.api.cli_args import FRESH_TRIAL_NAME, AsyncPPOConfig
from realhf.api.config_help import help_text, plugins_text
from realhf.base import logging
from realhf.base.importing import use_import_roots
from realhf.base.package_files import CONFIG_DIR
from realhf.base.process_exit import run_then_exit
from realhf.base.trial_files import (
    TrialFiles,
    checkpoints_dir,
    latest_published,
    published_weights_dir,
    read_metrics,
)
from realhf.base.trial_lease import TrialLeaseError, TrialLeaseHeldError, trial_lease
from realhf.base.trial_lock import TrialLock, TrialLockedError
from realhf.experiments.async_ppo import (
    ConfigError,
    evaluator_config,
    initial_setup,
    resumed_from,
    trial_files_of,
)
from realhf.experiments.config_keys import check_overrides
from realhf.experiments.config_loading import CONFIG_NAME, compose_config, register_schema
from realhf.impl.model.checkpoint import prune_leftovers, prune_saves
from realhf.scheduler.factory import make_launcher
from realhf.scheduler.progress_view import RunProgress
from realhf.scheduler.supervisor import Supervisor
from realhf.scheduler.trial_restarts import Death, TrialRestarts, death_of
from realhf.scheduler.worker_spec import (
    LauncherError,
    LauncherInterrupted,
    LauncherStopped,
    WorkerFailedError,
    WorkerSpec,
)
from realhf.system.stats.stats_logger import read_eval_metrics
from realhf.system.stats.stats_plot import preload_in_background, write_curves_png

logger = logging.getLogger("main_async_ppo")


def evaluate(model_path: str, cfg: AsyncPPOConfig) -> Dict[str, Any]:
    """The task's success rate ("greedy", "sampled": at T = evaluation.sampled_temperature, one
    answer per prompt), mean reward and agent metrics on the first evaluation.n_prompts held-out
    prompts: the rollout's agent and environment, answering with an engine in this process
    (realhf.system.evaluator.task_eval)."""
    from realhf.system.evaluator.task_eval import evaluate_weights

    ev = dataclasses.replace(
        evaluator_config(cfg, trial_files_of(cfg), 0), n_threads=max(1, cfg.actor.n_threads), nice=0
    )
    runs = [(0.0, 1), (cfg.evaluation.sampled_temperature, 1)]
    greedy, sampled = evaluate_weights(ev, model_path, runs, cfg.evaluation.n_prompts)
    out: Dict[str, Any] = {"n_prompts": greedy["n_prompts"]}
    for name, res in (("greedy", greedy), ("sampled", sampled)):
        out[name] = res["accuracy"]
        out[f"{name}_reward_mean"] = res["reward_mean"]
        out[f"{name}_reward_quantiles"] = res["reward_quantiles"]
        out[f"{name}_metrics"] = res["metrics"]
    return out


def evaluate_last_version(cfg: AsyncPPOConfig, paths: TrialFiles, final: str) -> None:
    """The last trained version belongs on the curve of the evaluations during training, whether
    or not it is a multiple of exp_ctrl.eval_freq_steps (the evaluator is stopped by now)."""
    from realhf.system.evaluator.evaluator_worker import evaluate_final_version
    from realhf.system.evaluator.task_eval import eval_line

    row = evaluate_final_version(evaluator_config(cfg, paths, 0), final, int(os.path.basename(final)))
    if row is not None:
        print("after the run, the last version: " + eval_line(row), flush=True)


def evaluation_line(when: str, now: Dict[str, Any], before: Optional[Dict[str, Any]], cfg: AsyncPPOConfig) -> str:
    """The report's line for the evaluation before or after training (the change since before, after)."""

    def value(key: str, sign: str = "") -> str:
        text = f"{now[key]:{sign}.3f}"
        return text + (f" ({now[key] - before[key]:+.3f})" if before is not None and key in before else "")

    extra = "".join(
        f"; {key} {now['greedy_metrics'][key]:.3f} greedy, {now['sampled_metrics'].get(key, float('nan')):.3f} sampled"
        for key in sorted(now["greedy_metrics"])
    )
    q = now.get("sampled_reward_quantiles")
    spread = f" (min/median/max {q[0]:+.3f}/{q[2]:+.3f}/{q[4]:+.3f})" if q else ""
    agent = cfg.rollout.agent
    if agent.reward_fn:  # the user's function grades, not the agent's environment
        grader = f"your reward function {agent.reward_fn}, a reward > 0 counting as solved"
    else:
        grader = f"agent {agent.type} with env {cfg.rollout.env.type}"
    return (
        f"{when} greedy accuracy {value('greedy')}, sampled accuracy {value('sampled')} "
        f"on {now['n_prompts']} held-out prompts (the success rate of {grader}; "
        f"mean reward {value('greedy_reward_mean', '+')} greedy, "
        f"{value('sampled_reward_mean', '+')} sampled{spread}{extra})"
    )


def prune_run_dir(run_dir: str, keep_last_saves: int) -> None:
    """Before the workers start (no writer yet) and at the end: delete the `.tmp-*`/`.old-*`
    halves of saves a killed writer left, and the saves beyond exp_ctrl.keep_last_saves."""
    prune_leftovers(Path(run_dir))
    for parent in (Path(run_dir) / "published_weights", Path(run_dir) / "checkpoints"):
        for role in parent.iterdir() if parent.is_dir() else []:
            if role.is_dir():
                prune_leftovers(role)
    saves = Path(run_dir) / "checkpoints"
    for role in saves.iterdir() if saves.is_dir() else []:
        if role.is_dir():
            prune_saves(checkpoints_dir(run_dir, role.name), keep_last_saves)


def latest_weights(files: TrialFiles) -> Optional[str]:
    return latest_published(str(published_weights_dir(files.run_dir, "actor")))[0]


def reward_curve(metrics: List[dict], n_rows: int = 10) -> str:
    """The per-step reward averaged over ~n_rows equal windows, with a bar per window."""
    if not metrics:
        return "(no train step completed)"
    size = max(1, len(metrics) // n_rows)
    lines = ["  steps      reward  success  staleness(max)"]
    for i in range(0, len(metrics), size):
        window = metrics[i : i + size]
        reward = sum(m["reward_mean"] for m in window) / len(window)
        success = sum(m["success_rate"] for m in window) / len(window)
        stale = max(m["head_offpolicyness_max"] for m in window)
        bar = "#" * int(round(success * 40))
        lines.append(
            f"  {window[0]['step']:>4}-{window[-1]['step']:<4} {reward:+7.3f}  {success:6.3f}  {stale:>6}  {bar}"
        )
    return "\n".join(lines)


def accuracy_curve(evals: List[dict]) -> str:
    """One line per evaluation during training: version, sampled accuracy, pass@k, with a bar."""
    if not evals:
        return "  (no evaluation finished: none was due, or the run ended during the first)"
    k = evals[-1]["eval/k"]
    lines = [f"  version  accuracy  pass@{k}"]
    for e in evals:
        bar = "#" * int(round(e["eval/accuracy"] * 40))
        lines.append(f"  {e['version']:>7}  {e['eval/accuracy']:8.3f}  {e['eval/pass_at_k']:6.3f}  {bar}")
    return "\n".join(lines)


def _has_files(path: str) -> bool:
    return os.path.isdir(path) and bool(os.listdir(path))


def claim_trial(cfg: AsyncPPOConfig) -> Optional[str]:
    """Make sure starting this trial deletes nothing that was not asked for; returns why it may
    not start, or None. Without a trial_name the run has a fresh one (FRESH_TRIAL_NAME)."""
    if cfg.trial_name == FRESH_TRIAL_NAME:
        print(
            f"trial_name not given: this run is trial_name={cfg.trial_name} (pass it with recover_mode=auto "
            "to resume it later)",
            flush=True,
        )
    paths = trial_files_of(cfg)
    existing = [d for d in (paths.log_dir, paths.run_dir) if _has_files(d)]
    if not existing or cfg.recover_mode != "disabled":
        return None
    if not cfg.overwrite:
        return (
            f"trial_name={cfg.trial_name} already has files ({', '.join(existing)}). Pass overwrite=true to "
            "delete them and start afresh, recover_mode=auto to resume it, or another trial_name (or none: "
            "a fresh one per run)"
        )
    print(f"overwrite=true: deleting the files of the earlier run of trial {cfg.trial_name}", flush=True)
    for d in existing:
        shutil.rmtree(d)
    return None


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM while no launcher watches: in the set-up, the evaluations before and
    after training, between a trial's launches. A KeyboardInterrupt, not a plain BaseException:
    asyncio lets only KeyboardInterrupt and SystemExit out of a callback (any other is logged and
    dropped), and the evaluation's event loop runs callbacks most of the time, so a signal landing
    in one went unnoticed and the run trained on."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


REDELIVERY_DELAY_S = 0.001  # a signal swallowed by a destructor is raised again this much later


class Stage:
    """What the run is doing outside its launches, for the line an interruption prints."""

    def __init__(self) -> None:
        self.now = "the set-up"
        self.lease_lost = False  # another launch took the trial: nothing here to resume
        self.interrupted: Optional[int] = None
        self._previous_unraisable_hook = sys.unraisablehook

    def on_signal(self, signum: int, frame: Any) -> None:
        """The handler `handling_signals` installs. Recorded as well as raised: the exception may
        land inside a call that catches broadly (a library's best-effort clean-up); `enter` checks
        the record."""
        self.interrupted = signum
        raise RunInterrupted(signum)

    def on_unraisable(self, unraisable: Any) -> None:
        """sys.unraisablehook while signals are handled. A signal that lands in a `__del__` or a
        weakref callback raises where Python can only print the exception and drop it (a garbage
        collection in the evaluation once swallowed a Ctrl-C, which then waited for the
        evaluation's 500 prompts). Raising the signal again here would land in this hook as well:
        a one-shot timer raises it a millisecond later, once the destructor is done (and again,
        should it land in another)."""
        if not isinstance(unraisable.exc_value, RunInterrupted):
            self._previous_unraisable_hook(unraisable)
        elif signal.getsignal(signal.SIGALRM) == self.on_alarm:
            signal.setitimer(signal.ITIMER_REAL, REDELIVERY_DELAY_S)
        # else the process's code uses SIGALRM itself: `enter` raises it at the next stage

    def on_alarm(self, signum: int, frame: Any) -> None:
        if self.interrupted is not None:
            raise RunInterrupted(self.interrupted)

    @contextlib.contextmanager
    def handling_signals(self, signals: Tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
        """`signals` end the run through `on_signal` while inside; the previous handlers and
        unraisable hook come back on leaving."""
        handlers = {sig: signal.signal(sig, self.on_signal) for sig in signals}
        if signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
            handlers[signal.SIGALRM] = signal.signal(signal.SIGALRM, self.on_alarm)
        self._previous_unraisable_hook, sys.unraisablehook = sys.unraisablehook, self.on_unraisable
        try:
            yield
        finally:
            sys.unraisablehook = self._previous_unraisable_hook
            if signal.SIGALRM in handlers:
                signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def enter(self, now: str) -> None:
        """Move on to `now`, unless a signal came during the stage that ends (and was swallowed)."""
        if self.interrupted is not None:
            raise RunInterrupted(self.interrupted)
        self.now = now


def run(cfg: AsyncPPOConfig) -> int:
    """The run, with SIGINT and SIGTERM outside a launch (which handles them itself) ending it
    with one line and the signal's exit code: no traceback, and no asyncio task or grader process
    left half-stopped."""
    stage = Stage()
    try:
        with stage.handling_signals():
            return run_locked(cfg, stage)
    except RunInterrupted as e:
        code = 128 + e.signum
        if stage.lease_lost:
            resume = "; the trial is the other launch's now"
        elif stage.now == "the set-up":
            resume = ""
        else:
            resume = "; recover_mode=auto continues from the last recovery checkpoint, if any"
        print(
            f"run interrupted (exit {code}): {e} during {stage.now}; every process stopped{resume}; "
            f"logs in {trial_files_of(cfg).log_dir}",
            file=sys.stderr,
            flush=True,
        )
        return code


def run_locked(cfg: AsyncPPOConfig, stage: Stage) -> int:
    """The run, its config checked, with the trial's lock and lease held."""
    try:
        specs = initial_setup(cfg)
    except (ConfigError, ValueError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    # One trial, one run: locked before claim_trial may delete anything (overwrite=true would
    # delete a live run's files), held until this function returns; the kernel drops it if we die.
    lock = TrialLock(trial_files_of(cfg).lock_path)
    try:
        lock.acquire()
    except TrialLockedError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    lease = None
    launchers: List[Supervisor] = []  # the one run_trial starts, for a lost lease to stop at once
    try:
        # Then the lease in a Redis shared with launches on other machines (other file systems,
        # other locks), before the launcher clears the trial's keys there.
        lease = trial_lease(
            cfg.cluster.name_resolve,
            cfg.experiment_name,
            cfg.trial_name,
            on_lost=lambda why: stop_this_run(why, launchers, stage),
        )
        if lease is not None:
            lease.acquire()
    except TrialLeaseError as e:
        if lease is not None:
            lease.store.close()
        lock.release()
        held = isinstance(e, TrialLeaseHeldError)
        print(f"config error: {e}" if held else f"run failed (exit 1): {e}", file=sys.stderr)
        return 2 if held else 1
    try:
        return run_trial(cfg, specs, launchers, stage)
    finally:
        if lease is not None:
            lease.release()
        lock.release()


def stop_this_run(why: str, launchers: List[Supervisor], stage: Stage) -> None:
    """The trial's lease went to another launch, which clears and reuses the trial's keys: stop at
    once (SIGTERM with no grace: the launcher stops every worker and exits 143) rather than fight
    over them — a graceful stop would ask the other launch's master for a checkpoint."""
    print(f"stopping this run: {why}", file=sys.stderr, flush=True)
    stage.lease_lost = True
    for launcher in launchers:
        launcher.stop_grace, launcher.owns_keys = 0.0, False
    os.kill(os.getpid(), signal.SIGTERM)


def run_trial(cfg: AsyncPPOConfig, specs: List[WorkerSpec], launchers: List[Supervisor], stage: Stage) -> int:
    """The run, with the trial's lock held; `stage` follows what it does outside its launches."""
    # After the config checks: a run refused for a bad value must not have deleted anything.
    refused = claim_trial(cfg)
    if refused is not None:
        print(f"config error: {refused}", file=sys.stderr)
        return 2
    paths = trial_files_of(cfg)
    point = resumed_from(specs)
    if point is not None:
        path, resumed = point
        print(
            f"resuming {cfg.experiment_name}/{cfg.trial_name} after step {resumed.get('step', resumed['version'])} "
            f"(version {resumed['version']}) from {path}",
            flush=True,
        )
    os.makedirs(paths.run_dir, exist_ok=True)
    prune_run_dir(paths.run_dir, cfg.exp_ctrl.keep_last_saves)

    before = {}
    if cfg.evaluation.n_prompts > 0:
        stage.enter("the evaluation before training")
        before = evaluate(cfg.actor.path, cfg)
        print(evaluation_line("before training:", before, None, cfg), flush=True)

    restarts = TrialRestarts(cfg.cluster.restart_policy)
    while True:
        stage.enter("the trial's start")
        launcher, error = launch(cfg, specs, paths, launchers)
        death = None if error is None else death_of(error, cfg.cluster.restart_policy)
        if death is None:
            break
        stage.enter("the trial's restart")
        specs, refusal = restart_specs(cfg, death, restarts)
        if refusal is not None:
            error = with_refusal(error, refusal)
            break
    if error is not None:
        return failed(error, paths)

    stage.enter("the final report (training had finished)")
    prune_run_dir(paths.run_dir, cfg.exp_ctrl.keep_last_saves)
    metrics = read_metrics(paths.log_dir)
    final = latest_weights(paths)
    print("\nreward curve (mean over windows of steps):\n" + reward_curve(metrics), flush=True)
    if cfg.exp_ctrl.eval_freq_steps > 0 and final is not None:
        evaluate_last_version(cfg, paths, final)
    if cfg.exp_ctrl.eval_freq_steps > 0:
        print(
            "\naccuracy curve (evaluations during training, exp_ctrl.eval_freq_steps="
            f"{cfg.exp_ctrl.eval_freq_steps}):\n" + accuracy_curve(read_eval_metrics(paths.log_dir)),
            flush=True,
        )
    png = write_curves_png(paths.log_dir, metrics, read_eval_metrics(paths.log_dir))
    if png is not None:
        print(f"\nreward and accuracy curves (PNG): {png}", flush=True)
    if cfg.evaluation.n_prompts > 0 and final is not None:
        after = evaluate(final, cfg)
        print(evaluation_line("after training: ", after, before, cfg), flush=True)
        with open(os.path.join(paths.log_dir, "accuracy.json"), "w") as f:
            json.dump({"before": before, "after": after, "weights": final, "steps": len(metrics)}, f)
    print(f"logs and metrics.jsonl: {paths.log_dir}\nfinal weights (HF format): {final}", flush=True)
    restarted = {name: n for name, n in launcher.restarts().items() if n}
    print(
        f"run complete (exit 0): {len(metrics)} train steps"
        + (f"; workers restarted: {restarted}" if restarted else "")
        + (f"; trial restarts: {len(restarts.history)} ({'; '.join(restarts.history)})" if restarts.history else ""),
        flush=True,
    )
    return 0


def launch(
    cfg: AsyncPPOConfig, specs: List[WorkerSpec], paths: TrialFiles, launchers: Optional[List[Supervisor]]
) -> Tuple[Supervisor, Optional[LauncherError]]:
    """One launch of the trial's processes, supervised until the trial is COMPLETE (error None)
    or something ends it (the error); every process is stopped when this returns."""
    launcher = make_launcher(cfg.cluster, cfg.experiment_name, cfg.trial_name, cfg.user_paths)
    if launchers is not None:
        launchers.append(launcher)
    total_steps = next(s.configs[0].total_train_steps for s in specs if s.worker_type == "master_worker")
    view = RunProgress(paths.log_dir, total_steps, enabled=cfg.stats.progress_bar)
    launcher.echo_to(view.print_lines)
    try:
        launcher.start()
        view.start()
        for spec in specs:
            launcher.submit(spec)
        preload_in_background()  # the final report's plotting library, while the workers start
        launcher.wait()
        return launcher, None
    except LauncherError as e:
        return launcher, e
    finally:
        launcher.stop_all()  # its last echoed lines still go through the view
        view.stop()


def restart_specs(cfg: AsyncPPOConfig, death: Death, restarts: TrialRestarts) -> Tuple[List[WorkerSpec], Optional[str]]:
    """After `death`: the trial's processes again, resuming from its last recovery checkpoint as
    recover_mode=auto does, and None — or why it does not restart."""
    try:
        specs = initial_setup(dataclasses.replace(cfg, recover_mode="auto"))
    except (ConfigError, ValueError) as e:
        return [], f"the restart's set-up failed: {e}"
    point = resumed_from(specs)
    step = 0 if point is None else int(point[1].get("step", point[1]["version"]))
    refusal = restarts.refusal(death, step)
    if refusal is None:
        where = f"after step {step} from {point[0]}" if point else "from the start (no recovery checkpoint yet)"
        print(f"{restarts.counted()}: {death.who} {death.cause}; resuming {where}", file=sys.stderr, flush=True)
        prune_run_dir(trial_files_of(cfg).run_dir, cfg.exp_ctrl.keep_last_saves)
    return specs, refusal


def with_refusal(error: LauncherError, refusal: str) -> LauncherError:
    """`error`, saying why the trial was not restarted after it."""
    if isinstance(error, WorkerFailedError):
        error.reason = f"{error.reason} (the trial was not restarted: {refusal})"
    error.args = (f"{error.args[0] if error.args else error} (the trial was not restarted: {refusal})",)
    return error


def failed(error: LauncherError, paths: TrialFiles) -> int:
    """Say how the run ended without completing; its exit code."""
    if isinstance(error, WorkerFailedError):
        print(f"run failed (exit 1): worker {error.worker} {error.reason}; logs in {paths.log_dir}", file=sys.stderr)
        return 1
    if isinstance(error, LauncherStopped):
        how = f"a recovery checkpoint of step {error.step}" if error.step else "nothing trained yet"
        print(
            f"run stopped (exit {EXIT_RESUMABLE}, resumable): {error}, with {how}; every process stopped; "
            f"start it again with recover_mode=auto to continue; logs in {paths.log_dir}",
            file=sys.stderr,
        )
        return EXIT_RESUMABLE
    if isinstance(error, LauncherInterrupted):
        code = 128 + error.signum  # the shell's convention: 130 for Ctrl-C, 143 for SIGTERM
        print(
            f"run interrupted (exit {code}): {error}; every process stopped; logs in {paths.log_dir}", file=sys.stderr
        )
        return code
    print(f"run failed (exit 1): {error}; logs in {paths.log_dir}", file=sys.stderr)
    return 1


# A run that SIGTERM/SIGINT stopped with a recovery checkpoint (cluster.stop_grace): EX_TEMPFAIL,
# "try again" — recover_mode=auto continues it.
EXIT_RESUMABLE = 75
COMMAND = "realhf-train"
register_schema()


@hydra.main(version_base=None, config_path=CONFIG_DIR, config_name=CONFIG_NAME)
def main(cfg) -> None:
    logging.setup()  # Hydra's start-up reconfigured logging; the launcher's INFO lines matter here
    exp: AsyncPPOConfig = OmegaConf.to_object(cfg)
    code = run(exp)
    if code:
        sys.exit(code)


def cli(command: str = COMMAND) -> None:
    """The command line: `command` is how the user ran it (named in --help and in errors). Ends
    the process (realhf.base.process_exit says why not through the interpreter's finalization)."""
    run_then_exit(lambda: command_line(command))


def command_line(command: str) -> None:
    args = sys.argv[1:]
    # Before Hydra: its answer to a misspelt key is to prepend '+' (which fails as well), not
    # the key that was meant.
    unknown = check_overrides(args, AsyncPPOConfig)
    if unknown is not None:
        print(f"config error: {unknown}; `{command} --help` lists every field", file=sys.stderr)
        sys.exit(2)
    if "--help" in args or "-h" in args:  # the values this run would use: YAML and overrides merged
        overrides = [a for a in args if a not in ("--help", "-h")]
        try:
            cfg = compose_config(overrides)
        except (HydraException, OmegaConfBaseException) as e:  # a value of the wrong type: said, not a traceback
            cause = str(e.__cause__).splitlines()[0] if e.__cause__ is not None else ""
            print(f"config error: {e}" + (f" ({cause})" if cause else ""), file=sys.stderr)
            sys.exit(2)
        use_import_roots(os.getcwd(), cfg.user_paths)  # as a run would (validate_experiment)
        usage = f"{command} [key=value ...]"
        print(
            help_text(cfg, "realhf-train: asynchronous PPO on the configured task (math by default).", usage)
            + "\n"
            + plugins_text(cfg)
        )
        sys.exit(0)
    main()


if __name__ == "__main__":
    cli("python -m realhf.apps.train")
