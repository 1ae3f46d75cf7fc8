"""A whole run with vLLM generating (allocation_mode vllm.*): the launcher starts realhf's server
around vLLM from .venv-vllm, the manager routes to it and updates its weights every version.
Skipped where `bash scripts/setup_env.sh vllm` has not made .venv-vllm."""

import os
import re

import pytest

from helpers.training_runs import SMALL_RUN, check_finished_run, run_training
from realhf.impl.inference.vllm_launcher import DEFAULT_PYTHON

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not os.access(DEFAULT_PYTHON, os.X_OK), reason="no .venv-vllm: `bash scripts/setup_env.sh vllm` makes it"
    ),
]

# vLLM's engine process binds cores by default: two servers and a trainer share two cores here.
VLLM_RUN = ["gen_server.vllm.cpu_threads_bind=nobind", "gen_server.vllm.kv_cache_gib=0.5"]


# One server taking each version's tensors from the trainer's broadcast (the default), two
# servers reloading each version's HF directory from disk.
@pytest.mark.parametrize("servers, weight_sync", [(1, "distributed"), (2, "disk")])
def test_a_run_with_vllm_servers_trains_and_every_version_reaches_them(
    tmp_path, no_leftover_processes, servers, weight_sync
):
    steps = 8
    proc, metrics, log_dir = run_training(
        tmp_path,
        f"vllm{servers}",
        f"allocation_mode=vllm.d{servers}m1p1+d1m1p1",
        f"weight_sync={weight_sync}",
        f"exp_ctrl.benchmark_steps={steps}",
        *SMALL_RUN,
        *VLLM_RUN,
        timeout=900,
    )
    check_finished_run(proc, metrics, steps, 2, tmp_path)
    for i in range(servers):
        with open(os.path.join(log_dir, f"vllm-{i}.log")) as f:
            updates = re.findall(r"weights v(\d+) -> v(\d+) from .* in ([0-9.]+)s", f.read())
        # Each version the trainer published reached the server, in order, with its seconds logged.
        versions = [int(new) for _, new, _ in updates]
        assert versions == sorted(versions) and versions and versions[-1] >= steps - 2, updates
