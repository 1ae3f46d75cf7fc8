"""Issue 26, item 2: a collective that one DP rank never enters ends the run within
`cluster.collective_timeout`, with an error naming the rank, the engine, the call and the step,
and every process stops (the planted bug: tests/helpers/skip_collective/sitecustomize.py)."""

import os
import time

import pytest

from helpers.paths import TESTS_DIR
from helpers.training_runs import Run, small_run

TIMEOUT_S = 10


@pytest.mark.e2e
def test_a_rank_that_skips_a_collective_ends_the_run_in_seconds_naming_rank_engine_call_and_step(
    tmp_path, no_leftover_processes, monkeypatch
):
    planted = os.path.join(TESTS_DIR, "helpers", "skip_collective")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([planted, TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    run = Run(
        tmp_path,
        "skip",
        "exp_ctrl.benchmark_steps=10",
        *small_run(2),
        "allocation_mode=native.d1m1p1+d2m1p1",
        f"cluster.collective_timeout={TIMEOUT_S}",
        "cluster.restart_policy.trial_restarts=0",  # the run ends on the first timeout (no whole-trial restart)
        # The bug is planted at interpreter start-up (sitecustomize, by the worker's command line):
        # each worker must be a fresh interpreter, not forked from the worker template.
        "cluster.fork_workers=false",
    )
    try:
        run.wait_for("the planted skip", lambda: "skips the actor's forward" in run.log("model_worker-1"), 300)
        skipped_at = time.monotonic()
        code = run.finish(timeout=120)
        ended_after = time.monotonic() - skipped_at
    finally:
        run.stop()
    out = run.output()
    assert code == 1, out[-4000:]
    # The waiting rank names itself, the engine, the call and the step, and the timeout.
    error = (
        "dp rank 0/2: actor forward, step node actor_inf of step 3: a collective did not complete within "
        f"{TIMEOUT_S}s (cluster.collective_timeout)"
    )
    assert error in run.log("model_worker-0"), run.log("model_worker-0")[-3000:]
    assert error in out, out[-4000:]  # the launcher's report carries it to the user
    assert len(run.metrics()) == 2  # steps 1 and 2 trained; step 3 never completed
    print(f"the run ended {ended_after:.1f}s after the skip (collective_timeout {TIMEOUT_S}s)")
    assert ended_after < TIMEOUT_S + 30, ended_after
    assert run.leftovers() == []
