"""The TRL peer's virtual environment and one run of its driver (`scripts/bench/trl_driver.py`).

TRL is never a dependency of realhf: the benchmark makes its own venv under `.bench/venvs/trl`
(gitignored) on first use. torch is installed FIRST and pinned to realhf's (the machine has a
local CPU wheel; an unpinned resolve would pull a multi-GB CUDA build), then TRL at `TRL_VERSION`
with the transformers, math-verify and peft versions of realhf's own environment, so both sides
run the same model code, the same grader and the same LoRA.

    python -m scripts.bench.peer_trl --short      # make the venv if needed, one short run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Dict, Sequence

from scripts.bench.common import REPO, emit, last_json_line, load_average, log, print_tables

VENV = os.path.join(REPO, ".bench", "venvs", "trl")
TRL_VERSION = "1.16.0"  # what pip resolved beside transformers 5.23 (checked 2026-11); pinned for repeatability
DRIVER = os.path.join(REPO, "scripts", "bench", "trl_driver.py")
MARKER = "realhf-bench-pins.json"  # written last: a venv without it is half-made and is rebuilt


def venv_python() -> str:
    return os.path.join(VENV, "bin", "python")


def pins() -> Dict[str, str]:
    return {
        "torch": metadata.version("torch").split("+")[0],
        "trl": TRL_VERSION,
        "transformers": metadata.version("transformers"),
        "math-verify": metadata.version("math-verify"),
        "peft": metadata.version("peft"),  # the SmolLM2 race's LoRA (realhf's test extra has it)
    }


def venv_ready() -> bool:
    """True when the venv exists with the current pins (a test skips the TRL run otherwise)."""
    path = os.path.join(VENV, MARKER)
    if not (os.path.isfile(venv_python()) and os.path.isfile(path)):
        return False
    with open(path) as f:
        return json.load(f) == pins()


def _pip(*args: str) -> None:
    cmd = [venv_python(), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    log(" ".join(cmd[2:]))
    subprocess.run(cmd, check=True, timeout=1800)


def ensure_venv() -> str:
    """Make (or repair) the TRL venv; returns its python."""
    if venv_ready():
        return venv_python()
    p = pins()
    log(f"creating the TRL venv at {VENV} ({p})")
    subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True, timeout=300)
    _pip(f"torch=={p['torch']}")
    _pip(
        f"trl=={p['trl']}",
        f"transformers=={p['transformers']}",
        f"math-verify=={p['math-verify']}",
        f"peft=={p['peft']}",
        f"torch=={p['torch']}",
    )
    with open(os.path.join(VENV, MARKER), "w") as f:
        json.dump(p, f)
    return venv_python()


def run_trl(
    out_dir: str,
    budget_s: float,
    threads: int,
    save_steps: int,
    seed: int = 1,
    timeout: float = 3600.0,
    *,
    save_secs: float = 0.0,
    budget_clock: str = "train",
    bf16: bool = False,
    groups: int = 16,
    minibatches: int = 2,
    driver_args: Sequence[str] = (),
) -> Dict:
    """One driver run; returns its summary plus `checkpoints` [{train_s, clock_s, step, version,
    path}]. clock_s counts from just before the driver process starts (its imports and model load
    on the clock); fp32 unless bf16."""
    from scripts.bench.accuracy_curve import saved_at_checkpoints

    python = ensure_venv()
    cmd = [python, DRIVER, "--out-dir", out_dir, "--budget-s", str(budget_s), "--threads", str(threads)]
    cmd += ["--save-steps", str(save_steps), "--save-secs", str(save_secs), "--seed", str(seed)]
    cmd += ["--budget-clock", budget_clock, "--groups", str(groups), "--minibatches", str(minibatches)]
    cmd += ["--bf16"] if bf16 else []
    cmd += list(driver_args)  # the task and algorithm when not the tiny default (see trl_driver.py)
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    load_before = load_average()
    t0 = time.monotonic()
    cmd += ["--clock-start", repr(time.time())]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the TRL driver exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    out = last_json_line(proc.stdout)
    out.update(
        wall_s=round(time.monotonic() - t0, 1),
        load_before=load_before,
        load_after=load_average(),
        checkpoints=saved_at_checkpoints(os.path.join(out_dir, "checkpoints")),
    )
    log(
        f"TRL {out['trl']} at {threads} threads ({'bf16' if out['bf16'] else 'fp32'}): {out['steps']} steps in {out['train_s']:.0f} train s, "
        f"{out['samples_per_s']:.1f} samples/s, {len(out['checkpoints'])} saves"
    )
    return out


def tables(r):
    return [
        (
            f"TRL {r['trl']} GRPOTrainer, {r['threads']} threads, budget {r['budget_s']} s",
            ["steps", "train s", "samples/s", "saves", "load 1m"],
            [
                [
                    r["steps"],
                    r["train_s"],
                    r["samples_per_s"],
                    len(r["checkpoints"]),
                    f"{r['load_before'][0]}/{r['load_after'][0]}",
                ]
            ],
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.peer_trl", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="a 20 s run")
    p.add_argument("--budget-s", type=float, default=372.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--save-steps", type=int, default=10)
    args = p.parse_args(argv)
    budget = 20.0 if args.short else args.budget_s
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as d:
        res = {"bench": "peer_trl", **run_trl(d, budget, args.threads, 2 if args.short else args.save_steps)}
    res["checkpoints"] = [{k: v for k, v in c.items() if k != "path"} for c in res["checkpoints"]]
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
