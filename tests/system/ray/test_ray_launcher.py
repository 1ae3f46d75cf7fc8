"""The Ray launcher on a real Ray cluster: the tiny task across nodes, restarts, Ctrl-C, recovery,
and a node that does not share cluster.fileroot."""

import json
import signal
import subprocess

import pytest
from omegaconf import OmegaConf

from helpers.ray_cluster import describe, launch_marker, marked_processes, three_nodes, unshared_node, wait_gone
from helpers.training_runs import SMALL_RUN, Run, run_training

pytest.importorskip("ray")

ETA = 2  # max_head_offpolicyness of these runs


def _placement(run: Run) -> dict:
    path = run.log_dir / "placement.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.e2e
@pytest.mark.slow  # CI time: the SIGINT test below trains on Ray too
def test_thirty_steps_across_two_nodes_with_the_generation_server_killed_and_restarted(tmp_path):
    with three_nodes() as (address, node_ids):
        run = Run(
            tmp_path,
            "ray2nodes",
            "cluster.launcher=ray",
            f"cluster.ray.address={address}",
            "+cluster.ray.resources.generation_server.node_a=1",
            "+cluster.ray.resources.model_worker.node_b=1",
            "exp_ctrl.benchmark_steps=30",
            f"max_head_offpolicyness={ETA}",
            *SMALL_RUN,
        )
        try:
            run.wait_steps(3, timeout=300)
            placed = _placement(run)
            marker = launch_marker(placed["model_worker/0"]["pid"])  # this launch's, not a test's beside it
            assert placed["generation_server/0"]["node_id"] == node_ids["node_a"], placed
            assert placed["model_worker/0"]["node_id"] == node_ids["node_b"], placed
            victim = placed["generation_server/0"]["pid"]
            subprocess.run(["kill", "-9", str(victim)], check=True)
            code = run.finish(timeout=600)
            out = run.output()
            assert code == 0, out[-5000:]
        finally:
            run.stop()
        after = _placement(run)
        # Restarted in its bundle, on the same node, as a new process.
        assert after["generation_server/0"]["node_id"] == node_ids["node_a"]
        assert after["generation_server/0"]["pid"] != victim
        assert "'generation_server/0': 1" in out, out[-2000:]
        metrics = run.metrics()
        assert [m["step"] for m in metrics] == list(range(1, 31))
        assert max(m["head_offpolicyness_max"] for m in metrics) <= ETA
        # Three nodes: every worker binds its node's address, not loopback.
        manager = OmegaConf.load(run.log_dir / "configs" / "gserver_manager-0.yaml")
        assert manager.config.host == after["gserver_manager/0"]["ip"] != "127.0.0.1"
        left = wait_gone([pid for pid, _ in marked_processes(marker)], "the trial's processes")
        assert left == [], describe(left)


def _ray_descendants(run: Run) -> set:
    """Ray daemons and Ray workers among the processes the run started (seen so far)."""
    run.track()
    return {pid for pid, (cmd, _) in run.seen.items() if cmd.startswith("ray::") or "site-packages/ray/" in cmd}


@pytest.mark.e2e
def test_sigint_checkpoints_and_ends_every_process_of_the_trial_and_the_ray_cluster_it_started(tmp_path):
    run = Run(tmp_path, "raysigint", "cluster.launcher=ray", "exp_ctrl.benchmark_steps=500", *SMALL_RUN)
    try:
        run.wait_steps(3, timeout=300)
        started = _ray_descendants(run)
        workers = {info["pid"] for info in _placement(run).values()}
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(timeout=120)
        out = run.output()
    finally:
        run.stop()
    # The stop is a checkpoint under Ray too (cluster.stop_grace): the master wrote it, then the
    # trial and its Ray cluster ended.
    assert code == 75, out[-4000:]
    assert "run stopped (exit 75, resumable): launcher received SIGINT; stopped after step" in out, out[-3000:]
    assert (tmp_path / "runs" / "async-ppo" / "raysigint" / "recover" / "recover_info.json").is_file()
    assert started and workers <= set(run.seen), "the launcher should have started a Ray cluster of its own"
    assert run.leftovers(timeout=30) == []


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sigkilled_launcher_leaves_no_worker_and_no_daemon_of_the_ray_cluster_it_started(tmp_path):
    # Nothing can clean up after a SIGKILL: the workers die with their actors when Ray's head
    # goes, and the launcher's watchdog sweeps the Ray daemons, which carry the trial's marker.
    run = Run(tmp_path, "raysigkill", "cluster.launcher=ray", "exp_ctrl.benchmark_steps=500", *SMALL_RUN)
    try:
        run.wait_steps(2, timeout=300)
        started = _ray_descendants(run)
        workers = {info["pid"] for info in _placement(run).values()}
        run.proc.kill()
        run.proc.wait(timeout=10)
        left = wait_gone(started | workers, "Ray and the trial", timeout=30)
        assert started and workers
        assert left == [], describe(left)
        assert run.leftovers() == []
    finally:
        run.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_node_that_does_not_share_the_fileroot_fails_the_run_before_any_worker_starts(tmp_path):
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"mount namespaces are not available here: {probe.stderr.decode()[:200]}")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        with unshared_node(cluster.address, str(tmp_path)):
            proc, metrics, log_dir = run_training(
                tmp_path,
                "unshared",
                "cluster.launcher=ray",
                f"cluster.ray.address={cluster.address}",
                *SMALL_RUN,
                timeout=300,
            )
    finally:
        cluster.shutdown()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "cluster.fileroot must be one directory shared by every node" in out, out[-4000:]
    assert "1 of 2 nodes do not see" in out and "FileNotFoundError" in out, out[-4000:]
    assert metrics == [] and not (log_dir / "configs" / "master_worker-0.yaml").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_killed_model_worker_ends_the_run_and_recover_mode_auto_continues_step_and_version(tmp_path):
    common = ["cluster.launcher=ray", "exp_ctrl.benchmark_steps=16", "exp_ctrl.ckpt_freq_steps=4", *SMALL_RUN]
    run = Run(tmp_path, "rayrecover", *common, "cluster.restart_policy.trial_restarts=0")
    try:
        run.wait_steps(6, timeout=300)
        subprocess.run(["kill", "-9", str(_placement(run)["model_worker/0"]["pid"])], check=True)
        code = run.finish(timeout=120)
        out = run.output()
    finally:
        run.stop()
    assert code == 1, out[-4000:]
    assert "worker model_worker/0 failed: exited with code -9 (SIGKILL)" in out, out[-4000:]
    assert "last 30 lines of" in out
    recover = tmp_path / "runs" / "async-ppo" / "rayrecover" / "recover" / "recover_info.json"
    saved = json.loads(recover.read_text())["version"]
    assert saved >= 4

    proc, metrics, _ = run_training(tmp_path, "rayrecover", *common, "recover_mode=auto", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"after step {saved} (version {saved})" in out
    # Every step once (those after the checkpoint were run again), versions continuing from it.
    assert [m["step"] for m in metrics] == list(range(1, 17))
    assert [m["version"] for m in metrics] == list(range(1, 17))
