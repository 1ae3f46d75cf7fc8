"""Issue 27 item 5: a GserverManager SIGKILLed mid-run is restarted by the launcher and continues
from its admission ledger in Redis (realhf.system.manager.admission_ledger): the rollouts its predecessor
admitted stay known (their schedule and finish calls succeed), admission capacity continues
where it was instead of from zero, and the rollout workers wait for the new manager, re-reading
its address, instead of failing. Measured: the groups a kill wastes (stale-dropped, abandoned or
failed in the steps around it) against one step's groups."""

import functools
import json
import os
import re
import signal
import time
from typing import Optional

import pytest

from helpers.training_runs import SMALL_RUN, Run, check_accounting

STEPS = 40
GROUPS_PER_STEP = 4  # SMALL_RUN's


def _waste(m: dict) -> int:
    return m["stale_dropped"] + m["groups_abandoned"] + m["groups_ended_failed"] + m["groups_ended_timed_out"]


def _paused_holding(run: Run, rollout: int) -> Optional[dict]:
    """Once the manager holds running rollouts: its status with the rollout worker paused (and
    left paused), read twice 0.3 s apart so that a call the worker sent just before the pause
    has landed; None while it holds none."""
    status = run.manager_status()
    if not (status and status["running"] > 0):
        return None
    os.kill(rollout, signal.SIGSTOP)
    first = run.manager_status()
    time.sleep(0.3)
    status = run.manager_status()
    if first and status and status["running"] == first["running"] > 0:
        return status
    os.kill(rollout, signal.SIGCONT)  # they ended as it paused: try again
    return None


@pytest.mark.e2e
def test_a_killed_manager_is_restarted_and_continues_its_accounting(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "mgrkill", f"exp_ctrl.benchmark_steps={STEPS}", *SMALL_RUN)
    kills, running = [], []
    try:
        for n in (5, 20):
            run.wait_steps(n)
            # Kill it while it holds running rollouts: those must stay known to its successor. The
            # rollout worker is paused from before the count is read until the successor has taken
            # over (well within its heartbeat TTL), so none of them ends in between: on a slower
            # host the restart takes longer than a rollout, and the successor found none running.
            rollout = run.worker_pid("rollout_worker-0")
            holding = functools.partial(_paused_holding, run, rollout)
            status = run.wait_for("the manager to hold running rollouts", holding, 60, 0.05)
            try:
                before = run.metrics()[-1]
                run.kill_worker("gserver_manager-0")
                kills.append(before)
                running.append(status["running"])
                run.wait_for(
                    "the restarted manager to take over the ledger",
                    lambda: (
                        len(re.findall(r"restarted \(start \d+ of this run\)", run.log("gserver_manager-0")))
                        >= len(kills)
                    ),
                    120,
                )
            finally:
                os.kill(rollout, signal.SIGCONT)
        code = run.finish()
    finally:
        run.stop()
    out, metrics = run.output(), run.metrics()
    assert code == 0, out[-5000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    manager = run.log("gserver_manager-0")
    assert "realhf launcher: restart 2 of gserver_manager/0" in manager, manager[-3000:]
    took_over = [
        int(n)
        for n in re.findall(
            r"restarted \(start \d+ of this run\): continuing from the admission "
            r"ledger with (\d+) rollouts running",
            manager,
        )
    ]
    print(f"running at the kills: {running}; taken over: {took_over}")
    assert took_over == running and min(running) > 0
    # The rollout worker (SMALL_RUN has one) waited for the new manager: it neither failed nor
    # was restarted.
    log = run.log("rollout_worker-0")
    assert "realhf launcher: restart" not in log, log[-3000:]
    assert metrics[-1]["manager_starts"] == 3
    # What each kill cost: groups wasted from the step before it to 5 steps after (the run's own
    # staleness drops included), against one step's groups.
    for before in kills:
        after = metrics[before["step"] + 5 - 1]
        wasted = _waste(after) - _waste(before)
        print(f"kill after step {before['step']}: {wasted} groups wasted in the next 5 steps")
        assert wasted <= GROUPS_PER_STEP, (before, after)
    (a,) = check_accounting(tmp_path, out)
    print(json.dumps(a))
    assert a["manager_starts"] == 3 and a["abandoned"] == 0
