"""Issue 27 item 5: a GserverManager SIGKILLed mid-run is restarted by the launcher and continues
from its admission ledger in Redis (realhf.system.manager.admission_ledger): the rollouts its predecessor
admitted stay known (their schedule and finish calls succeed), admission capacity continues
where it was instead of from zero, and the rollout workers wait for the new manager, re-reading
its address, instead of failing. Measured: the groups a kill wastes (stale-dropped, abandoned or
failed in the steps around it) against one step's groups."""

import json
import re

import pytest

from helpers.training_runs import SMALL_RUN, Run, check_accounting

STEPS = 40
GROUPS_PER_STEP = 4  # SMALL_RUN's


def _waste(m: dict) -> int:
    return m["stale_dropped"] + m["groups_abandoned"] + m["groups_ended_failed"] + m["groups_ended_timed_out"]


@pytest.mark.e2e
def test_a_killed_manager_is_restarted_and_continues_its_accounting(tmp_path, no_leftover_processes):
    run = Run(tmp_path, "mgrkill", f"exp_ctrl.benchmark_steps={STEPS}", *SMALL_RUN)
    kills, running = [], []
    try:
        for n in (5, 20):
            run.wait_steps(n)
            # Kill it while it holds running rollouts: those must stay known to its successor.
            status = run.wait_for(
                "the manager to hold running rollouts",
                lambda: (s := run.manager_status()) and s["running"] > 0 and s,
                60,
                interval=0.05,
            )
            before = run.metrics()[-1]
            run.kill_worker("gserver_manager-0")
            kills.append(before)
            running.append(status["running"])
            run.wait_for(
                "the restarted manager to take over the ledger",
                lambda: (
                    len(re.findall(r"restarted \(start \d+ of this run\)", run.log("gserver_manager-0"))) >= len(kills)
                ),
                120,
            )
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
    print(f"running at the kills (last status read): {running}; taken over: {took_over}")
    assert len(took_over) == 2 and sum(took_over) > 0
    # The rollout workers waited for the new manager: none failed or was restarted.
    for i in range(2):
        log = run.log(f"rollout_worker-{i}")
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
