"""Issue 32, item 5: the whole system trains with tensor and pipeline parallelism in the trainer
(`allocation_mode=native.d1m1p1+d1m2p1`: two model workers splitting every decoder layer;
`+d1m1p2`: two pipeline stages; the first worker of a replica is its DP head, which receives the
trajectories and hands each step's batch to the others; realhf.base.trainer_layout).

Correctness is the point here (two cores make it slow): the run ends well, both ranks logged
their split, the split trainer's log-probs of the first batch equal the generation server's
(the weights it loaded are the ones it split), and the published weights moved. The engine's
equality with an unsplit step is tests/unit/impl/engine/test_tensor_parallel.py."""

import json

import pytest
from safetensors.torch import load_file

from helpers.paths import TINY_MATH
from helpers.training_runs import check_finished_run, run_training

ETA = 2


def _run_split(
    tmp_path, mode_override: str, n_workers: int, steps: int, split: str = "layers split over 2 tensor-parallel ranks"
):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "tp",
        f"exp_ctrl.benchmark_steps={steps}",
        mode_override,
        f"max_head_offpolicyness={ETA}",
        "evaluation.n_prompts=0",
    )
    check_finished_run(proc, metrics, steps, ETA, tmp_path)
    logs = sorted(log_dir.glob("model_worker-*.log"))
    assert len(logs) == n_workers
    for log in logs:
        assert split in log.read_text()
    # Version 0 on both sides: the split model's log-probs are the server's (float rounding).
    assert metrics[0]["actor_inf_behav_abs_diff"] < 1e-4, metrics[0]
    assert all("loss" in m for m in metrics)
    published = sorted(tmp_path.rglob("published_weights/actor/*/model.safetensors"), key=lambda p: int(p.parent.name))
    assert published, "no published weights"
    start = load_file(f"{TINY_MATH}/sft/model.safetensors")
    end = load_file(str(published[-1]))
    assert max(float((end[k] - start[k]).abs().max()) for k in start) > 1e-3
    return metrics


@pytest.mark.e2e
def test_a_tensor_parallel_trainer_runs_the_whole_system(tmp_path, no_leftover_processes):
    metrics = _run_split(tmp_path, "allocation_mode=native.d1m1p1+d1m2p1", 2, steps=8)
    print(json.dumps({k: metrics[-1][k] for k in ("step", "success_rate", "loss")}))


@pytest.mark.e2e
@pytest.mark.slow
def test_data_and_tensor_parallelism_together_run_the_whole_system(tmp_path, no_leftover_processes):
    """d2m2: two DP ranks of two tensor-parallel ranks each; the master balances the heads."""
    metrics = _run_split(tmp_path, "allocation_mode=native.d1m1p1+d2m2p1", 4, steps=8)
    assert all(m["dp_token_imbalance"] >= 1.0 for m in metrics)


@pytest.mark.e2e
@pytest.mark.slow
def test_lora_adapters_split_over_tensor_parallel_ranks_run_the_whole_system(tmp_path, no_leftover_processes):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "tp",
        "exp_ctrl.benchmark_steps=8",
        "allocation_mode=native.d1m1p1+d1m2p1",
        "actor.lora.r=8",
        "actor.optimizer.lr=1e-3",
        f"max_head_offpolicyness={ETA}",
        "evaluation.n_prompts=0",
    )
    check_finished_run(proc, metrics, 8, ETA, tmp_path)
    assert metrics[0]["actor_inf_behav_abs_diff"] < 1e-4, metrics[0]
    assert "LoRA r=8" in (log_dir / "model_worker-1.log").read_text()


@pytest.mark.e2e
def test_a_pipelined_trainer_runs_the_whole_system(tmp_path, no_leftover_processes):
    _run_split(tmp_path, "allocation_mode=native.d1m1p1+d1m1p2", 2, steps=8, split="pipeline stage")


@pytest.mark.e2e
@pytest.mark.slow
def test_tensor_and_pipeline_parallelism_together_run_the_whole_system(tmp_path, no_leftover_processes):
    _run_split(tmp_path, "allocation_mode=native.d1m1p1+d1m2p2", 4, steps=8, split="pipeline stage")
