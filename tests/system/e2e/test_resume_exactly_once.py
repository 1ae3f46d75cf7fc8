"""Issue 14, item 4: the recovery checkpoint records exactly which prompts are pending, and a
killed-and-resumed run neither repeats nor skips any.

A run with a recovery checkpoint after every step is killed mid-run (SIGKILL of a trainer rank:
the run fails), then rerun with recover_mode=auto to the end. From `trained_qids.jsonl` (cut to
the checkpoint and continued by the resumed run, so it is the whole trial's training): no qid is
trained twice, and per rollout worker the trained (or stale-dropped, or failed) qids are its draw
order (the deterministic PromptSampler of its shard) up to the last one trained, with holes only
among its last draws (groups still in flight or buffered when the run stopped). Before the
pending list, the groups in flight or buffered at the checkpoint were skipped: holes far from
the end, where the first run was killed."""

import json
import re

import pytest

from helpers.prompt_order import draw_order, trained_qids
from helpers.training_runs import Run, small_run

STEPS, KILL_AT, N_WORKERS, SEED = 30, 10, 2, 1  # SEED: training/configs/async-ppo.yaml
ETA, B, MAX_CONCURRENT = 2, 4, 8  # SMALL_RUN: groups_per_step=4, max_concurrent_rollouts=8
# Admitted but not trained at the end of a run: at most the admission budget ((η+1)·B beyond the
# trained count) plus what is running; a group still pending at the end was drawn at most about
# that many draws of its worker before the last one trained (η+1 more steps would make it stale).
TAIL = (ETA + 2) * B + MAX_CONCURRENT
COMMON = [
    f"exp_ctrl.benchmark_steps={STEPS}",
    "exp_ctrl.ckpt_freq_steps=1",
    f"max_head_offpolicyness={ETA}",
    *small_run(N_WORKERS),
]


LOGS = [f"model_worker-{i}" for i in range(2)] + [f"rollout_worker-{i}" for i in range(N_WORKERS)]


def consumed_untrained(logs: dict, before_version: int = 1 << 30) -> set:
    """Qids dropped as stale by a trainer (at a version before `before_version`: a drop after the
    checkpoint is undone by the resume) or failed in a rollout worker: consumed without training,
    so neither holes nor pending."""
    text = "".join(logs[name] for name in LOGS if name.startswith("model_worker"))
    out = {
        q
        for v, line in re.findall(r"dropped \d+ stale groups .* at version (\d+)\); .*; qids (.*)", text)
        if int(v) < before_version
        for q in line.split()
    }
    failed = "".join(logs[name] for name in LOGS if name.startswith("rollout_worker"))
    return out | set(re.findall(r"failed \(\d+ in a row\): .*?episode (\S+) ", failed))


@pytest.mark.e2e
def test_a_killed_and_resumed_run_trains_every_drawn_prompt_exactly_once(tmp_path, no_leftover_processes):
    trial = "exact"
    first = Run(tmp_path, trial, *COMMON, "cluster.restart_policy.trial_restarts=0")  # resumed by hand below
    try:
        first.wait_steps(KILL_AT, timeout=300)
        first.kill_worker("model_worker-0")
        assert first.finish(timeout=120) != 0, first.output()[-3000:]
    finally:
        first.stop()
    recover = tmp_path / "runs" / "async-ppo" / trial / "recover" / "recover_info.json"
    info = json.loads(recover.read_text())
    # Something was in flight or buffered at the checkpoint (8 episodes run at a time): what the test is about.
    assert info["step"] >= KILL_AT - 1 and len(info["rollout_pending"]) > 0, info
    first_logs = {name: first.log(name) for name in LOGS}  # the resumed run appends to these files
    consumed = consumed_untrained(first_logs, before_version=info["version"])

    second = Run(tmp_path, trial, *COMMON, "recover_mode=auto")
    try:
        assert second.finish(timeout=400) == 0, second.output()[-5000:]
    finally:
        second.stop()
    second_logs = {name: second.log(name)[len(first_logs[name]) :] for name in LOGS}
    consumed |= consumed_untrained(second_logs)
    assert "already received" not in "".join(second_logs.values())  # nothing pushed twice either
    resumed = [
        re.search(r"(\d+) prompts pending at the recovery checkpoint", second.log(f"rollout_worker-{i}"))
        for i in range(N_WORKERS)
    ]
    assert all(resumed), [second.log(f"rollout_worker-{i}")[-2000:] for i in range(N_WORKERS)]
    assert sum(int(m.group(1)) for m in resumed) == len(info["rollout_pending"])

    steps = trained_qids(second.log_dir)
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    trained = [q for s in steps for q in s["qids"]]
    assert len(trained) == len(set(trained)) == STEPS * B, "a prompt group was trained twice"
    assert not set(trained) & consumed
    for i in range(N_WORKERS):
        order = draw_order(i, 1000, N_WORKERS, SEED)
        drawn = set(order)
        mine = {q for q in set(trained) | consumed if q in drawn}
        last = max(order.index(q) for q in mine)
        holes = [pos for pos in range(last + 1) if order[pos] not in mine]
        # A hole far from the end is a prompt skipped across the resume (in flight or buffered at
        # the checkpoint, and not rerun).
        assert all(pos >= last - TAIL for pos in holes), (i, holes, last, info["step"])
        assert len(holes) <= (ETA + 1) * B + MAX_CONCURRENT, (i, holes)  # buffered + running at the end
