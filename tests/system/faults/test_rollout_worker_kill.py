"""Issue 6, bullet 1: a rollout worker SIGKILLed mid-run is restarted with the same index; the
groups its dead incarnation had in flight are settled at the manager (pushed ones finished,
the others abandoned: no leaked admission slot) and run again first; the run completes."""

import json
import re

import pytest

from helpers.training_runs import EXPERIMENT, SMALL_RUN, Run, check_accounting
from realhf.base import names

# Long enough that the run outlasts the restart: a step of this small run takes ~0.2 s, and the
# other rollout worker alone keeps the trainer fed while worker 0 restarts.
STEPS = 300


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkilled_rollout_worker_is_restarted_and_its_in_flight_groups_are_readmitted(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "rwkill", f"exp_ctrl.benchmark_steps={STEPS}", *SMALL_RUN)
    pattern = re.compile(
        r"previous incarnation left (\d+) groups in flight: (\d+) already pushed \(reported "
        r"finished\), (\d+) slots released at the manager, (\d+) prompts re-admitted first"
    )

    def settle_report(n: int):
        """The n-th restart's account of what its predecessor left, once it is logged."""
        found = pattern.findall(run.log("rollout_worker-0"))
        return found[n - 1] if len(found) >= n else None

    def running_now(redis) -> bool:
        """Whether the worker's record (written at every change) holds a group still generating."""
        raw = redis.get(names.rollout_record(EXPERIMENT, run.trial, 0))
        inflight = (json.loads(raw) if raw else {}).get("inflight") or {}
        return any(isinstance(e, dict) and e.get("state") == "running" for e in inflight.values())

    try:
        run.wait_steps(2)
        redis = run.redis()
        # The worker is mostly idle, refused by the staleness rule while the trainer catches up (a
        # group of this run generates in ~0.1 s): the kill waits for a group in flight. One can
        # still end between the look and the kill; the restarted worker then reports 0 and the
        # test kills it again.
        for kills in range(1, 4):  # cluster.restart_policy.max_restarts = 3
            run.wait_for("rollout worker 0 to have a group in flight", lambda: running_now(redis), 60, interval=0.02)
            run.kill_worker("rollout_worker-0")
            report = run.wait_for(
                "the restarted rollout worker to settle its predecessor's groups",
                lambda kills=kills: settle_report(kills),
                180,
            )
            left, pushed, released, readmitted = (int(x) for x in report)
            if left > 0:
                break
        status = run.manager_status()
        code = run.finish()
    finally:
        run.stop()
    out = run.output()
    assert code == 0, out[-5000:]
    assert f"realhf launcher: restart {kills} of rollout_worker/0" in run.log("rollout_worker-0")
    assert left > 0  # it was killed with work in flight (each worker keeps up to 4 groups)
    # Every group of the dead incarnation is accounted for: finished if pushed, else its slot freed.
    assert pushed + released == left and readmitted == released
    assert status is not None and status["abandoned"] == released
    assert status["running"] <= 8  # max_concurrent_rollouts: no slot held by the dead incarnation
    assert [m["step"] for m in run.metrics()] == list(range(1, STEPS + 1))
    assert f"'rollout_worker/0': {kills}" in out
    (a,) = check_accounting(tmp_path, out)
    assert a["abandoned"] >= released, a
    assert run.leftovers() == []
