"""The embedded code task learns: RL on assets/tiny-code, before/after and the reward curve.

    python -m scripts.bench.code_task [--steps 300] [--eval-prompts 500]     # a training run
    python -m scripts.bench.code_task --eval-only assets/tiny-code/sft [...]  # evaluate checkpoints

A run is `examples/run_code_task.sh`'s command (training/main_async_ppo.py with the code task's
overrides) for `--steps` steps; its evaluation before and after training is the launcher's
(realhf.system.evaluator.task_eval: the math-single-step agent with the code environment on the first
`--eval-prompts` held-out rows, greedy and sampled at T=1). Printed: those, and the training
reward and success rate over the first and the last third of the steps. `--eval-only` runs the
same evaluation on HF directories without training. Ends with one JSON line, measures, never asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Sequence

from scripts.bench.common import REPO, emit, load_average, log

TASK = os.path.join(REPO, "assets", "tiny-code")
EXPERIMENT = "code-task"


def data_paths() -> Dict[str, str]:
    """The task's data, written (seeded) on first use as examples/run_code_task.sh does."""
    train, test = (os.path.join(TASK, "data", f"{s}.jsonl") for s in ("train", "test"))
    if not (os.path.exists(train) and os.path.exists(test)):
        cmd = [sys.executable, "scripts/make_code_task.py", "--out", TASK, "--data-only"]
        subprocess.run(cmd, cwd=REPO, check=True)
    return {"train": train, "test": test}


def task_overrides(paths: Dict[str, str]) -> List[str]:
    """examples/run_code_task.sh's overrides, with absolute paths."""
    return [
        f"experiment_name={EXPERIMENT}",
        f"actor.path={os.path.join(TASK, 'sft')}",
        f"dataset.path={paths['train']}",
        f"dataset.test_path={paths['test']}",
        "rollout.env.type=code",
        "ppo.gen.max_new_tokens=16",
        "evaluation.max_new_tokens=16",
    ]


def evaluate_checkpoints(paths: Sequence[str], n_prompts: int, test_path: str) -> List[Dict[str, Any]]:
    """Greedy and sampled (T=1) success rate of each HF directory through the task's agent and env."""
    from realhf.api.cli_args import EnvConfig
    from realhf.api.worker_configs import EvaluatorConfig
    from realhf.system.evaluator.task_eval import evaluate_weights

    out = []
    for path in paths:
        cfg = EvaluatorConfig(test_path=test_path, env=EnvConfig(type="code"), max_new_tokens=16, model_path=path)
        t0 = time.perf_counter()
        greedy, sampled = evaluate_weights(cfg, path, [(0.0, 1), (1.0, 1)], n_prompts)
        row = {
            "checkpoint": os.path.relpath(path, REPO),
            "greedy": greedy["accuracy"],
            "sampled": sampled["accuracy"],
            "greedy_tests_passed": greedy["metrics"].get("tests_passed"),
            "sampled_syntax_error": sampled["metrics"].get("syntax_error"),
            "n_prompts": greedy["n_prompts"],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        log(json.dumps(row))
        out.append(row)
    return out


def thirds(metrics: List[Dict[str, Any]], key: str) -> List[float]:
    k = max(1, len(metrics) // 3)
    return [sum(m[key] for m in part) / len(part) for part in (metrics[:k], metrics[-k:])]


def run(steps: int, n_prompts: int, extra: Sequence[str]) -> Dict[str, Any]:
    from realhf.base.trial_files import TrialFiles, read_metrics

    paths = data_paths()
    root = tempfile.mkdtemp(prefix="realhf-code-bench-")
    cmd = [
        sys.executable,
        "training/main_async_ppo.py",
        *task_overrides(paths),
        f"exp_ctrl.benchmark_steps={steps}",
        f"evaluation.n_prompts={n_prompts}",
        f"cluster.fileroot={root}",
        "trial_name=bench",
        "stats.progress_bar=false",
        "cluster.device=cpu",
        *extra,
    ]
    log(" ".join(cmd))
    load_before, t0 = load_average(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the training run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    log_dir = TrialFiles(root, EXPERIMENT, "bench").log_dir
    metrics = read_metrics(log_dir)
    with open(os.path.join(log_dir, "accuracy.json")) as f:
        acc = json.load(f)
    reward, success = thirds(metrics, "reward_mean"), thirds(metrics, "success_rate")
    result = {
        "bench": "code_task",
        "steps": len(metrics),
        "wall_s": round(wall, 1),
        "train_s": round(sum(m.get("step_time_s", 0.0) for m in metrics), 1),
        "n_prompts": acc["before"]["n_prompts"],
        "greedy_before": acc["before"]["greedy"],
        "greedy_after": acc["after"]["greedy"],
        "sampled_before": acc["before"]["sampled"],
        "sampled_after": acc["after"]["sampled"],
        "reward_first_third": round(reward[0], 3),
        "reward_last_third": round(reward[1], 3),
        "success_first_third": round(success[0], 3),
        "success_last_third": round(success[1], 3),
        "load_before": load_before,
        "load_after": load_average(),
        "log_dir": log_dir,
    }
    for line in proc.stdout.splitlines():
        if line.startswith(("before training:", "after training:")):
            log(line)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="training steps")
    ap.add_argument("--eval-prompts", type=int, default=500, help="held-out prompts of each evaluation")
    ap.add_argument("--eval-only", nargs="+", default=None, metavar="HF_DIR", help="only evaluate these")
    ap.add_argument("overrides", nargs="*", help="further key=value overrides of the training run")
    args = ap.parse_args(argv)
    if args.eval_only:
        rows = evaluate_checkpoints(args.eval_only, args.eval_prompts, data_paths()["test"])
        emit({"bench": "code_task", "evaluations": rows})
        return 0
    emit(run(args.steps, args.eval_prompts, args.overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
