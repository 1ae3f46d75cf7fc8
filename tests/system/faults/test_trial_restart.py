"""Issue 49, item 2: a run heals itself. When a process it cannot do without dies — a trainer
rank, the master, the trial's Redis — the launcher stops everything and starts the trial again
from its last recovery checkpoint (cluster.restart_policy.trial_restarts), logging each restart
with its cause; the run completes all its steps, trains no group twice, and its accounting
holds. The same process dying again before a new checkpoint is a crash loop, and ends the run
naming it."""

import json
import re

import psutil
import pytest

from helpers.prompt_order import trained_qids
from helpers.training_runs import SMALL_RUN, Run

STEPS, CKPT = 12, 2


def _live_redis_pid(run) -> int:
    run.track()
    for pid, (cmd, _) in run.seen.items():
        if "redis-server" in cmd and psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return pid
    raise AssertionError(f"no live redis-server; output:\n{run.output()[-3000:]}")


def _other_pid(run, worker: str, old: int):
    """The pid of `worker`'s live process if it is not `old` (the restarted trial's), else None."""
    try:
        pid = run.worker_pid(worker)
    except AssertionError:  # between the launches: none alive
        return None
    return pid if pid != old else None


def _restarted(run, k: int) -> bool:
    return f"trial restart {k} (of at most" in run.output()


@pytest.mark.e2e
def test_kill_9_of_the_trainer_then_the_master_then_redis_each_heal_and_the_run_completes(
    tmp_path, no_leftover_processes
):
    run = Run(
        tmp_path,
        "heal",
        f"exp_ctrl.benchmark_steps={STEPS}",
        f"exp_ctrl.ckpt_freq_steps={CKPT}",
        "cluster.restart_policy.trial_restarts=3",
        *SMALL_RUN,
    )
    killed = []
    try:
        for k, (who, at) in enumerate([("model_worker-0", 3), ("master_worker-0", 6), ("redis", 9)], start=1):
            run.wait_steps(at, timeout=300)
            if who == "redis":
                psutil.Process(_live_redis_pid(run)).kill()
            else:
                run.kill_worker(who)
            killed.append((who, len(run.metrics())))
            run.wait_for(f"trial restart {k}", lambda k=k: _restarted(run, k), timeout=120)
        code = run.finish(timeout=300)
    finally:
        run.stop()
    out = run.output()
    assert code == 0, out[-5000:]
    restarts = re.findall(
        r"trial restart (\d) \(of at most 3 within 3600 s\): (\S+) (.*); resuming after step (\d+)", out
    )
    assert [(n, who) for n, who, _, _ in restarts] == [
        ("1", "model_worker/0"),
        ("2", "master_worker/0"),
        ("3", "redis"),
    ]
    assert "exited with code -9 (SIGKILL)" in restarts[0][2] and "exited with code -9 (SIGKILL)" in restarts[1][2]
    assert "redis-server" in restarts[2][2] and "died" in restarts[2][2], restarts[2]
    for (_, step_killed), (_, _, _, resumed) in zip(killed, restarts):
        # Resumed from the last recovery checkpoint: at most CKPT steps before the kill.
        assert int(resumed) % CKPT == 0 and step_killed - CKPT <= int(resumed) <= step_killed, (killed, restarts)
    assert f"run complete (exit 0): {STEPS} train steps; trial restarts: 3" in out, out[-3000:]
    # The console echoes each launch's master lines once: after the last restart, only its own.
    last_launch = out[out.index("trial restart 3 (") :]
    assert last_launch.count("master_worker/0: configured; running") == 1, last_launch[-5000:]
    steps = trained_qids(run.log_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    trained = [q for s in steps for q in s["qids"]]
    assert len(trained) == len(set(trained)), "a prompt group was trained twice"
    accounting = json.loads((run.log_dir / "accounting.json").read_text())
    assert accounting["holds"] and accounting["lost"] == 0, accounting
    assert [m["step"] for m in run.metrics()] == list(range(1, STEPS + 1))
    assert run.leftovers() == []


@pytest.mark.e2e
def test_the_trainer_dying_again_before_a_new_checkpoint_is_a_crash_loop_that_ends_the_run(
    tmp_path, no_leftover_processes
):
    run = Run(tmp_path, "loop", "exp_ctrl.benchmark_steps=1000", "exp_ctrl.ckpt_freq_steps=1000", *SMALL_RUN)
    try:
        run.wait_steps(1, timeout=300)
        first = run.kill_worker("model_worker-0")
        run.wait_for("trial restart 1", lambda: _restarted(run, 1), timeout=120)
        again = run.wait_for("the restarted trainer", lambda: _other_pid(run, "model_worker-0", first), timeout=120)
        psutil.Process(again).kill()
        code = run.finish(timeout=120)
    finally:
        run.stop()
    out = run.output()
    assert code == 1, out[-4000:]
    assert "resuming from the start (no recovery checkpoint yet)" in out, out[-4000:]
    failed = [line for line in out.splitlines() if line.startswith("run failed (exit 1):")]
    assert failed and "worker model_worker/0 exited with code -9 (SIGKILL)" in failed[-1], out[-3000:]
    assert "a crash loop: model_worker/0 died again before a new recovery checkpoint (still none)" in failed[-1]
    assert "trial restart 2" not in out
    assert run.leftovers() == []
