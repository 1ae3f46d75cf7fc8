"""The long-reasoning example, shortened (issue 45): training/configs/async-ppo-long.yaml through
every process of a run — answers from 8 to hundreds of tokens in one batch, a KV cache sized for
them, the trainer's length-ordered micro-batches, the before/after evaluation on held-out
problems at 768 new tokens. That the reward rises takes the example's 200 steps
(docs/benchmarks.md, "The long-reasoning task"), not CI."""

import math
import statistics
import subprocess
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.training_runs import check_accounting, training_command, trial_processes
from realhf.base.trial_files import TrialFiles, read_metrics
from scripts.make_long_math_task import main as make_task

STEPS = 6


@pytest.mark.e2e
def test_the_long_task_config_trains_on_answers_of_very_different_lengths(tmp_path, no_leftover_processes):
    assert make_task(["--out", str(tmp_path / "task"), "--data-only", "--n-train", "400", "--n-test", "8"]) == 0
    data = tmp_path / "task" / "data"
    command = training_command(
        tmp_path,
        "long",
        f"dataset.path={data / 'train.jsonl'}",
        f"dataset.test_path={data / 'test.jsonl'}",
        f"exp_ctrl.benchmark_steps={STEPS}",
        "groups_per_step=8",
        "evaluation.n_prompts=8",
        "exp_ctrl.ckpt_freq_steps=0",
    )
    command[2:2] = ["--config-name", "async-ppo-long"]  # Hydra's options go before the overrides
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    log_dir = Path(TrialFiles(str(tmp_path), "async-ppo-long", "long").log_dir)
    metrics = read_metrics(str(log_dir))
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(math.isfinite(m["loss"]) and m["n_samples"] == 64 for m in metrics), metrics
    # Long answers, and answers of very different lengths: tens of tokens per sample on average
    # (the warm start: ~120), with rows far longer than that in the same steps.
    per_sample = [m["gen_tokens"] / m["n_samples"] for m in metrics]
    assert statistics.mean(per_sample) > 60, per_sample
    assert max(m["dp_tokens_max"] for m in metrics) > 2000
    assert all(0.0 < m["success_rate"] < 1.0 for m in metrics[1:]), [m["success_rate"] for m in metrics]
    # Answers end, not cut off at 768: over the run, not per step, since the longest answers of a
    # version finish last and arrive together (one step at 4/64 while the run's rate was 5/384).
    cut = sum(m["no_eos_rate"] * m["n_samples"] for m in metrics) / sum(m["n_samples"] for m in metrics)
    assert cut < 0.05, [m["no_eos_rate"] for m in metrics]
    server_log = (log_dir / "generation_server-0.log").read_text()
    assert "x 800 tokens" in server_log  # the KV cache sized by the config, not the model's 1024
    assert "after training:" in out and (log_dir / "curves.png").stat().st_size > 1000
    check_accounting(tmp_path, out)
    assert trial_processes(str(tmp_path)) == []
