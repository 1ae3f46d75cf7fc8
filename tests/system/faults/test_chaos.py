"""Issue 27 item 10: a chaos run. A real training run on this machine while, every few seconds,
a random fault hits a random worker (at most three before the run makes its next step): SIGKILL
of a worker type the launcher restarts (generation server, rollout worker, manager), or SIGSTOP of
any worker (trainer and master included) for a few seconds, then SIGCONT. The run must finish
with every step, account for every admitted group (none lost in transit:
realhf.system.manager.admission_ledger) and leave no process behind; with one trainer rank and
one server, and with two trainer ranks beside one or two servers. What it saw is printed and
recorded in docs/benchmarks.md ("Chaos run")."""

import collections
import json
import os
import random
import signal
import statistics
import time

import pytest

from helpers.training_runs import Run, check_accounting, small_run

STEPS = 300
FAULTS_UNTIL_STEP = 260  # then the run finishes undisturbed
KILLABLE = ["generation_server-0", "rollout_worker-0", "rollout_worker-1", "gserver_manager-0"]
STOPPABLE = KILLABLE + ["model_worker-0", "master_worker-0"]
# layout: (allocation_mode override, rollout workers, more workers to kill, more to pause). Rollout
# workers are split among the trainer's ranks (receiver_of): with two of them at DP=2 a rank
# starves while its one worker restarts; with four, its other worker goes on feeding it.
DP2 = ["allocation_mode=native.d1m1p1+d2m1p1"]
LAYOUTS = {
    "dp1": ([], 2, [], []),
    "dp2": (DP2, 2, [], ["model_worker-1"]),
    "dp2_four_workers": (DP2, 4, ["rollout_worker-2", "rollout_worker-3"], ["model_worker-1"]),
    "two_servers_dp2": (["allocation_mode=native.d2m1p1+d2m1p1"], 2, ["generation_server-1"], ["model_worker-1"]),
}
# A pause shorter than the heartbeat TTL (10 s) heals without the launcher stepping in.
PAUSE_S = (1.0, 6.0)
GAP_S = (2.0, 6.0)
FAULTS_PER_STEP = 3  # at most this many faults before the run makes its next step
STALL_S = 120.0  # no step for this long while faults go on: a stall (the launcher's back-off is at most 30 s)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize(
    "layout,seed", [("dp1", 1), ("dp1", 2), ("dp2", 2), ("dp2_four_workers", 2), ("two_servers_dp2", 1)]
)
def test_random_kills_and_pauses_lose_no_group_and_leave_no_process(tmp_path, layout, seed, no_leftover_processes):
    allocation, rollout_workers, more_killable, more_stoppable = LAYOUTS[layout]
    killable = KILLABLE + more_killable
    stoppable = killable + STOPPABLE[len(KILLABLE) :] + more_stoppable
    rng = random.Random(seed)
    run = Run(
        tmp_path,
        f"chaos{seed}",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *small_run(rollout_workers),
        *allocation,
        "cluster.restart_policy.max_restarts=50",
        "cluster.restart_policy.trial_restarts=0",  # a pause of the trainer or master ends the run, as asserted
    )
    faults = collections.Counter()
    log = []
    try:
        run.wait_steps(5)
        steps, stepped_at = 0, time.monotonic()
        while len(run.metrics()) < FAULTS_UNTIL_STEP:
            time.sleep(rng.uniform(*GAP_S))
            if run.proc.poll() is not None:
                break
            if len(run.metrics()) > steps:
                steps, stepped_at = len(run.metrics()), time.monotonic()
            assert time.monotonic() - stepped_at < STALL_S, (
                f"no step for {STALL_S:.0f}s after step {steps}; faults so far: {log}\n{run.output()[-6000:]}"
            )
            if sum(step >= steps for step, _, _ in log) >= FAULTS_PER_STEP:
                # Faults by the clock alone outran the heal on a loaded host (dp2 seed 2 beside
                # another slow test: 17 faults at step 193, every killable worker in its 30 s
                # restart back-off at once): a burst while the run heals, then a step first.
                continue
            if rng.random() < 0.5:
                worker = rng.choice(killable)
                try:
                    run.kill_worker(worker)
                except (AssertionError, ProcessLookupError):  # between its death and its restart
                    continue
                faults[f"kill {worker}"] += 1
                log.append((len(run.metrics()), "kill", worker))
            else:
                worker, pause = rng.choice(stoppable), rng.uniform(*PAUSE_S)
                try:
                    pid = run.kill_worker(worker, signal.SIGSTOP)
                except (AssertionError, ProcessLookupError):
                    continue
                time.sleep(pause)
                try:
                    os.kill(pid, signal.SIGCONT)  # the same process: not a restarted one's pid
                except ProcessLookupError:
                    pass
                faults[f"pause {worker}"] += 1
                log.append((len(run.metrics()), f"pause {pause:.1f}s", worker))
        code = run.finish()
    finally:
        run.stop()
    out = run.output()
    print(f"{layout} seed {seed}: {sum(faults.values())} faults: {dict(sorted(faults.items()))}")
    for step, what, worker in log:
        print(f"  at step {step}: {what} {worker}")
    assert code == 0, out[-6000:]
    assert [m["step"] for m in run.metrics()] == list(range(1, STEPS + 1))
    # How long the faults held training up: every step's time includes its wait for data.
    times = [m["step_time_s"] for m in run.metrics()]
    worst = max(range(STEPS), key=times.__getitem__)
    print(
        f"step time: median {statistics.median(times):.2f} s, longest {times[worst]:.2f} s (step {worst + 1}), "
        f"{sum(times):.0f} s for all {STEPS} steps"
    )
    (a,) = check_accounting(tmp_path, out)
    print("accounting: " + json.dumps(a))
    assert a["lost"] == 0
    assert run.leftovers() == []
