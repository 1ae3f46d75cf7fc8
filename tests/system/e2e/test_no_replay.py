"""Issue 14, item 4: a rollout worker that exits by an exception (not a SIGKILL) resumes its
prompt order where it stopped: no prompt trained twice, none skipped.

The agent plug-in raises an error that ends its worker process once (FatalOnceAgent, guarded by
a marker file); the launcher restarts the worker. Read from `trained_qids.jsonl` (one line per
train step, written by the master), per rollout worker: every qid is trained at most once, and
the trained qids are its draw order (the deterministic PromptSampler of its shard) up to the
last one trained, minus only groups near the end (still in flight or buffered when the run
stopped). Before the fix the dead worker's sampler position was deleted on exit, so its next
incarnation drew the shard again from the start, and the episodes cancelled at its exit (and
the one that raised) left the in-flight record, so they were never run again."""

import json
import os
import re

import pytest

from helpers.paths import TESTS_DIR
from helpers.prompt_order import draw_order, trained_qids
from helpers.training_runs import run_training, small_run

STEPS, N_WORKERS, SEED = 80, 2, 1  # SEED: training/configs/async-ppo.yaml; 80 steps outlast the restart (~8 s)
ETA = 16  # large, so that few groups go stale (those that do are read from the model worker log)


@pytest.mark.e2e
def test_a_rollout_worker_killed_by_an_exception_resumes_its_prompt_order(tmp_path, no_leftover_processes):
    marker = tmp_path / "fatal.marker"
    env = dict(os.environ, PYTHONPATH=TESTS_DIR)
    proc, metrics, log_dir = run_training(
        tmp_path,
        "fatal",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *small_run(N_WORKERS),
        f"max_head_offpolicyness={ETA}",
        "rollout.agent.type=helpers.faulty_plugins:FatalOnceAgent",
        f"+rollout.agent.args.marker={marker}",
        timeout=400,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert marker.exists() and [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    logs = {i: (log_dir / f"rollout_worker-{i}.log").read_text(errors="replace") for i in range(N_WORKERS)}
    died = [i for i, text in logs.items() if "FatalAgentError" in text]
    assert len(died) == 1, {i: t[-2000:] for i, t in logs.items()}
    text = logs[died[0]]
    assert re.search(r"prompt order resumed at epoch 0, position \d+ \(from this worker's previous incarnation\)", text)
    left = re.search(
        r"previous incarnation left (\d+) groups in flight: (\d+) already pushed \(reported finished\), "
        r"(\d+) slots released at the manager, (\d+) prompts re-admitted first",
        text,
    )
    assert left and int(left.group(4)) >= 1, text[-3000:]  # at least the episode that raised
    resumed_at = int(re.search(r"prompt order resumed at epoch 0, position (\d+)", text).group(1))
    # A group may still go stale (an episode slower than 16 steps of this tiny trainer): consumed too.
    model_logs = "".join(p.read_text(errors="replace") for p in log_dir.glob("model_worker-*.log"))
    stale = {q for line in re.findall(r"dropped \d+ stale groups .*; qids (.*)", model_logs) for q in line.split()}
    # Every drop is counted: the last step's metrics, or the end-of-run accounting (its final look
    # at the buffers may drop more after the last step).
    final = json.loads((log_dir / "accounting.json").read_text())["stale_dropped"]
    assert len(stale) == final >= metrics[-1]["stale_dropped"], (stale, final, metrics[-1]["stale_dropped"])

    steps = trained_qids(log_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    trained = [q for s in steps for q in s["qids"]]
    assert len(trained) == len(set(trained)) == STEPS * 4  # groups_per_step=4, none twice
    for i in range(N_WORKERS):
        order = draw_order(i, 1000, N_WORKERS, SEED)
        mine = {q for q in trained + sorted(stale) if q in set(order)}
        last = max(order.index(q) for q in mine)
        holes = [pos for pos in range(last + 1) if order[pos] not in mine]
        # Drawn but untrained at the end: only groups in flight or buffered when the run stopped
        # (max_concurrent_rollouts 8 + (eta + 1) * groups_per_step).
        assert len(holes) <= 8 + (ETA + 1) * 4, (i, holes, last)
        if i == died[0]:
            # What the dead incarnation had drawn (in flight, cancelled, the one that raised) was run again.
            assert all(pos >= resumed_at for pos in holes), (i, holes, resumed_at)
            assert set(order[:resumed_at]) <= mine
    assert "already received" not in model_logs  # nothing was pushed twice either
