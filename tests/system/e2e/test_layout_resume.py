"""Issue 32: a run checkpointed at one trainer layout resumes at another. Four steps at d2m1p1
(two DP ranks) end with a recovery checkpoint; the same trial rerun with recover_mode=auto at
d1m2p1 (one replica split over two tensor-parallel ranks) continues from step 4 to step 8, the
sharded checkpoint resharded into the split layers (torch.distributed.checkpoint)."""

import json

import pytest

from helpers.training_runs import check_accounting, run_training, trial_log_dir, trial_processes

COMMON = ["exp_ctrl.ckpt_freq_steps=2", "max_head_offpolicyness=1", "evaluation.n_prompts=0"]


@pytest.mark.e2e
@pytest.mark.slow
def test_a_d2m1_checkpoint_resumes_at_d1m2(tmp_path, no_leftover_processes):
    trial = "layout"
    proc, metrics, _ = run_training(
        tmp_path, trial, *COMMON, "exp_ctrl.benchmark_steps=4", "allocation_mode=native.d1m1p1+d2m1p1"
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    recover = tmp_path / "runs" / "async-ppo" / trial / "recover"
    info = json.loads((recover / "recover_info.json").read_text())
    assert info["version"] == 4 and info["dp_size"] == 2

    proc2, metrics, _ = run_training(
        tmp_path,
        trial,
        *COMMON,
        "exp_ctrl.benchmark_steps=8",
        "allocation_mode=native.d1m1p1+d1m2p1",
        "recover_mode=auto",
    )
    out = proc2.stdout + proc2.stderr
    assert proc2.returncode == 0, out[-5000:]
    assert "after step 4 (version 4)" in out
    assert [m["step"] for m in metrics] == list(range(1, 9))
    assert [m["version"] for m in metrics] == list(range(1, 9))
    logs = trial_log_dir(tmp_path, trial)
    assert "recovered version 4" in (logs / "model_worker-1.log").read_text()
    assert "layers split over 2 tensor-parallel ranks" in (logs / "model_worker-1.log").read_text()
    check_accounting(tmp_path, out)
    assert trial_processes(str(tmp_path)) == []
