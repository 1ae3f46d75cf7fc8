"""Issue 14, item 3: a group the trainer refuses as malformed frees its admission slot.

A real ModelWorker process (DP head 0) receives, straight on its trajectory socket, a group whose
reward is NaN, one without samples, one with an empty answer, and a well-formed group pushed twice.
The master's own bookkeeping (`MasterWorker._update_stale_dropped` on the real `fetch` replies,
as `_wait_for_data` calls it) must publish the three malformed ones in the per-rank list the
manager reads (names.stale_dropped): each was admitted and reported accepted, and would
otherwise hold its rank's staleness budget for the rest of the run. The duplicate is refused
but not handed back (the manager counted only one of the two copies)."""

from __future__ import annotations

import copy
import json
import math
import time

import pytest

from helpers.model_worker_harness import EXP, ModelWorkerHarness
from helpers.trajectories import TINY_SFT, load_rows, load_tiny, make_groups
from realhf.api.cli_args import ModelTrainEvalConfig, PPOHyperparameters
from realhf.api.worker_configs import MasterWorkerConfig, ModelWorkerConfig
from realhf.base import name_resolve, names
from realhf.system.master.master_worker import MasterWorker
from realhf.system.worker_base import WorkerContext

pytestmark = pytest.mark.system


@pytest.mark.e2e
def test_malformed_groups_pushed_to_a_dp_head_are_published_as_dropped_for_their_rank(
    redis_url, redis_name_resolve, tmp_path, no_leftover_processes
):
    model, tok = load_tiny()
    good, nan_group, empty_answer = make_groups(model, tok, load_rows(3), group_size=2)
    nan_group = copy.deepcopy(nan_group)
    nan_group["samples"][1]["reward"] = math.nan
    no_samples = dict(good, qid="no-samples", samples=[])
    empty_answer = copy.deepcopy(empty_answer)
    for field in ("output_ids", "logprobs", "versions"):
        empty_answer["samples"][0][field] = []

    cfg = ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=TINY_SFT),
        ppo=PPOHyperparameters(),
        run_dir=str(tmp_path),
        max_head_offpolicyness=4,
        master_discovery_timeout=120,
    )
    h = ModelWorkerHarness(str(tmp_path), "rejected", 1, cfg, redis_url)
    try:
        # Malformed first: one pusher keeps its order, so all are parsed before `good` is buffered.
        h.push(0, [nan_group, no_samples, empty_answer, good, good])
        ctx = WorkerContext(
            experiment_name=EXP, trial_name="rejected", worker_type="master_worker", name_resolve=redis_name_resolve
        )
        master = MasterWorker(ctx, MasterWorkerConfig(n_model_workers=1, groups_per_step=1, data_poll_interval=0.05))
        master._stream, master.shares, master.step, master.version = h.stream, [1], 0, 0
        master.stale_dropped, master.rejected, master._stale_dropped_per_rank = 0, 0, None
        master._t_last_step = time.monotonic()
        name_resolve.add(names.experiment_status(EXP, "rejected"), "RUNNING", replace=True)
        master._wait_for_data()
        # The duplicate arrives after `good`: poll until the head has seen all five.
        deadline = time.monotonic() + 30
        while True:
            replies = h.stream.call_all("fetch", {"take": 0}, timeout=60)
            master._update_stale_dropped(replies)
            if replies[0]["received"] + replies[0]["rejected"] >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        h.close()
    reply = replies[0]
    assert reply["rejected"] == 3 and reply["duplicates"] == 1 and reply["buffered"] == 1, reply
    assert reply["stale_dropped"] == 0
    assert json.loads(name_resolve.get(names.stale_dropped(EXP, "rejected"))) == [3]
    assert master.rejected == 3 and master.stale_dropped == 0
