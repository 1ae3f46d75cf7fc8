"""Issue 27 item 8 on the real system: a run keeps its newest recovery checkpoint and the one
before it; when a file of the newest is damaged on disk, a rerun with recover_mode=resume names
the damaged file and resumes from the previous checkpoint, instead of a trainer dying inside
torch.distributed.checkpoint with a bare EOFError."""

import pytest

from helpers.training_runs import EXPERIMENT, run_training, small_run, trial_processes
from realhf.base.trial_files import TrialFiles, recover_dir, recover_prev_dir
from realhf.impl.model.recover_checkpoint import read_info, verify

# DP=2: both trainer ranks must load the same checkpoint, the one the launcher chose.
COMMON = [
    "exp_ctrl.benchmark_steps=4",
    "exp_ctrl.ckpt_freq_steps=2",
    "allocation_mode=native.d1m1p1+d2m1p1",
    *small_run(2),
]


@pytest.mark.e2e
@pytest.mark.slow  # CI time: verify/choose/fallback and the launcher's choice are unit-tested
def test_a_damaged_newest_checkpoint_is_named_and_the_run_resumes_from_the_previous_one(
    tmp_path, no_leftover_processes
):
    trial = "damaged"
    first, _, _ = run_training(tmp_path, trial, *COMMON, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-5000:]
    run_dir = TrialFiles(str(tmp_path), EXPERIMENT, trial).run_dir
    newest, previous = recover_dir(run_dir), recover_prev_dir(run_dir)
    assert read_info(newest)["version"] == 4 and read_info(previous)["version"] == 2
    shard = sorted((newest / "actor").glob("*.distcp"))[-1]  # rank 1's
    with open(shard, "r+b") as f:  # as a disk or a copy that lost the file's end would leave it
        f.truncate(shard.stat().st_size // 2)

    second, metrics, log_dir = run_training(tmp_path, trial, *COMMON, "recover_mode=resume", timeout=300)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-5000:]
    # The launcher's warning names the file, once: it verifies once, before any worker starts.
    assert out.count(f"{newest}: actor/{shard.name} has") == 1, out[-5000:]
    assert f"after step 2 (version 2) from {previous}" in out
    for rank in (0, 1):
        assert f"recovered version 2 from {previous}" in (log_dir / f"model_worker-{rank}.log").read_text()
    assert [(m["step"], m["version"]) for m in metrics] == [(1, 1), (2, 2), (3, 3), (4, 4)]
    # The resumed run's step-4 checkpoint replaced the damaged one; the whole previous one stays.
    assert read_info(newest)["version"] == 4 and verify(newest) is None
    assert read_info(previous)["version"] == 2 and verify(previous) is None
    assert trial_processes(str(tmp_path)) == []
