"""A whole run with vLLM generating (allocation_mode vllm.*): the launcher starts realhf's server
around vLLM from .venv-vllm, the manager routes to it and updates its weights every version.
Skipped where `bash scripts/setup_env.sh vllm` has not made .venv-vllm."""

import os
import re
import time

import psutil
import pytest

from helpers.training_runs import SMALL_RUN, Run, check_accounting, check_finished_run, run_training
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
# servers reloading each version's HF directory from disk. The second is --runslow (69 s): in CI,
# test_vllm_server.py's update from disk covers vLLM's reload from a directory, and the manager's
# routing over two servers is the same code as the built-in engine's.
@pytest.mark.parametrize("servers, weight_sync", [(1, "distributed"), pytest.param(2, "disk", marks=pytest.mark.slow)])
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


@pytest.mark.slow  # ~70 s; in CI: test_generation_server.py's dying backend server, test_generation_server_kill.py
def test_a_killed_vllm_server_is_restarted_with_the_current_weights_and_the_run_completes(
    tmp_path, no_leftover_processes
):
    """vLLM's server (the generation server worker's child) SIGKILLed mid-run: the worker sees it
    exit and exits, the launcher restarts the worker, which starts a new vLLM server that is routed
    only once it holds trained weights (the newest version on disk as it starts, or, where the
    trainer has written none since (it waits for data; its last broadcast went through before the
    kill), the current version sent again over the weight group); the requests it held are
    resubmitted, none fails, nothing of the
    killed server (its engine core included) is left, and the run completes every step. With one
    server the rollouts must wait for the new one, so the run outlasts the restart at any speed."""
    steps = 10
    run = Run(
        tmp_path,
        "vllmkill",
        "allocation_mode=vllm.d1m1p1+d1m1p1",
        f"exp_ctrl.benchmark_steps={steps}",
        *SMALL_RUN,
        *VLLM_RUN,
    )
    try:
        run.wait_steps(2)
        victim_url = run.server_url(0)
        worker = psutil.Process(run.worker_pid("generation_server-0"))
        servers = [c for c in worker.children() if "realhf.launch_vllm_server" in " ".join(c.cmdline())]
        assert len(servers) == 1, [c.cmdline() for c in worker.children()]
        killed_tree = [servers[0], *servers[0].children(recursive=True)]
        servers[0].kill()
        t_kill = time.monotonic()

        def rejoined():
            s = run.manager_status()
            return s and [x for x in s["servers"] if x["url"] != victim_url] and s

        status = run.wait_for("the restarted vLLM server to be routed", rejoined, 400)
        rejoin_s = time.monotonic() - t_kill
        log0 = run.log("generation_server-0")
        assert re.search(r"vllm server \S+ exited with code -9", log0), log0[-3000:]
        assert "realhf launcher: restart 1 of generation_server/0" in log0, log0[-3000:]
        new_url = next(x["url"] for x in status["servers"] if x["url"] != victim_url)
        manager_log = run.log("gserver_manager-0")
        routed = re.search(
            rf"generation server {re.escape(new_url)} (?:caught up with the trainer's weights \(it reported "
            r"version|routed at weight version) (\d+)",
            manager_log,
        )
        assert routed and int(routed.group(1)) >= 1, manager_log[-3000:]
        loaded = re.search(r"trainer is at version \d+: loading published version [1-9]", log0)
        resent = re.search(
            rf"version [1-9]\d* sent again while the trainer waits for data: \[[^\]]*{re.escape(new_url)}",
            run.log("model_worker-0"),
        )
        assert loaded or resent, log0[-2000:] + run.log("model_worker-0")[-2000:]
        code = run.finish()
        out = run.output()
        assert code == 0, out[-5000:]
    finally:
        run.stop()
    print(f"the killed vLLM server's replacement was routed {rejoin_s:.0f}s after the SIGKILL")
    _, alive = psutil.wait_procs(killed_tree, timeout=10)
    assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], [p.pid for p in alive]
    assert [m["step"] for m in run.metrics()] == list(range(1, steps + 1)), out[-3000:]
    rollout_logs = run.log("rollout_worker-0") + run.log("rollout_worker-1")
    assert not re.search(r"episode \S+ failed", rollout_logs), rollout_logs[-3000:]
    check_accounting(run.tmp_path, out)
    assert run.leftovers() == []
