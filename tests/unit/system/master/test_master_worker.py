"""The MasterWorker: its bookkeeping without processes (DP shares, what it says while it waits for
data, with a fake request stream standing in for the model workers), then MasterWorker + 2
ModelWorkers on real processes and real Redis, fed by the test process acting as the rollout
workers: three steps, metrics, published versions, the staleness guard, clean exit."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time

import pytest
import torch

from helpers import shared_template
from helpers.trajectories import TINY_SFT, load_rows, load_tiny, make_groups
from realhf.api.cli_args import (
    ExperimentSaveEvalControl,
    ModelTrainEvalConfig,
    NameResolveConfig,
    PPOHyperparameters,
    StatsLoggingConfig,
)
from realhf.api.worker_configs import MasterWorkerConfig, ModelWorkerConfig
from realhf.base import name_resolve, names
from realhf.base.trial_files import read_completions
from realhf.scheduler.local import LocalLauncher, WorkerSpec
from realhf.system.master.master_worker import MasterWorker
from realhf.system.streams.push_pull_stream import NameResolvingZmqPusher
from realhf.system.worker_base import WorkerContext

pytestmark = pytest.mark.system

EXP, TRIAL = "train-e2e", "t0"
B, GROUP, ETA, STEPS, N_DP = 4, 4, 1, 3, 2
METRIC_KEYS = {
    "step",
    "version",
    "reward_mean",
    "success_rate",
    "head_offpolicyness_max",
    "stale_dropped",
    "samples_per_s",
    "gen_tokens_per_s",
    "step_time_s",
}


class _FakeStream:
    """Rank 0 holds its share; rank 1 never receives anything."""

    def __init__(self):
        self.calls = []

    def call_all(self, handle_name, data=None, **kw):
        self.calls.append((handle_name, data))
        return [
            {"dp_rank": 0, "buffered": 2, "stale_dropped": 1, "received": 3, "invalid": 0},
            {"dp_rank": 1, "buffered": 0, "stale_dropped": 0, "received": 0, "invalid": 0},
        ]


def test_master_waiting_for_data_names_the_rank_and_what_it_lacks_then_times_out(redis_name_resolve, caplog):
    ctx = WorkerContext(
        experiment_name="mlogic", trial_name="t", worker_type="master_worker", name_resolve=redis_name_resolve
    )
    cfg = MasterWorkerConfig(
        n_model_workers=2,
        groups_per_step=4,
        data_poll_interval=0.02,
        data_log_interval=0.05,
        stall_timeout=0.1,
        data_timeout=0.4,
    )
    w = MasterWorker(ctx, cfg)
    w._stream, w.shares, w.step, w.version = _FakeStream(), [2, 2], 0, 0
    w.stale_dropped, w.rejected, w._stale_dropped_per_rank = 0, 0, None
    w._t_last_step = time.monotonic()
    name_resolve.add(names.experiment_status("mlogic", "t"), "RUNNING", replace=True)
    with caplog.at_level(logging.INFO), pytest.raises(TimeoutError) as e:
        w._wait_for_data()
    assert "dp rank 1: holds 0/2 groups (received 0, stale-dropped 0, invalid 0)" in str(e.value)
    assert "dp rank 0" not in str(e.value)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and warnings[0].startswith("stall: no train step completed")
    assert "dp rank 1: holds 0/2 groups" in warnings[0] and "manager: not registered" in warnings[0]
    assert all(c == ("fetch", {"take": 0}) for c in w._stream.calls)  # nothing taken while short
    # Stale drops reported by the ranks are published for the manager while the master waits,
    # per rank (each rank's admission budget gets its own drops back); the total is kept for metrics.
    assert json.loads(name_resolve.get(names.stale_dropped("mlogic", "t"))) == [1, 0]
    assert w.stale_dropped == 1


def test_master_waiting_for_data_says_which_rank_is_short_before_it_calls_it_a_stall(redis_name_resolve, caplog):
    ctx = WorkerContext(
        experiment_name="mlogic2", trial_name="t", worker_type="master_worker", name_resolve=redis_name_resolve
    )
    cfg = MasterWorkerConfig(
        n_model_workers=2, groups_per_step=4, data_poll_interval=0.02, data_log_interval=0.05, data_timeout=0.3
    )
    w = MasterWorker(ctx, cfg)
    w._stream, w.shares, w.step, w.version = _FakeStream(), [2, 2], 4, 4
    w.stale_dropped, w.rejected, w._stale_dropped_per_rank = 0, 0, None
    w._t_last_step = time.monotonic()
    name_resolve.add(names.experiment_status("mlogic2", "t"), "RUNNING", replace=True)
    with caplog.at_level(logging.INFO), pytest.raises(TimeoutError):
        w._wait_for_data()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "groups ready" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("step 5: 2/4 groups ready after ") and lines[0].endswith("(dp rank 1 holds 0/2)")


def _restamp(msg: dict, version: int) -> dict:
    msg = copy.deepcopy(msg)
    msg["qid"] = f"{msg['qid']}@{version}"
    for s in msg["samples"]:
        s["versions"] = [version] * len(s["output_ids"])
    return msg


def _feed(stop: threading.Event, groups, errors: list, secret: str = ""):
    """Like rollout workers: for every new model version push B fresh groups (B / N_DP per DP
    head); at version 2 also push one group generated at version 0, which eta = 1 makes stale."""
    try:
        pushers = [
            NameResolvingZmqPusher(EXP, TRIAL, i, N_DP, N_DP, discovery_timeout=120, secret=secret) for i in range(N_DP)
        ]
        try:
            fed = set()
            key = names.model_version(EXP, TRIAL, "actor")
            while not stop.is_set():
                try:
                    v = int(name_resolve.get(key))
                except name_resolve.NameEntryNotFoundError:
                    v = 0
                if v not in fed and v < STEPS:
                    fed.add(v)
                    fresh = [_restamp(g, v) for g in groups[v * B : (v + 1) * B]]
                    for i, g in enumerate(fresh):
                        pushers[i % N_DP].push(g)
                    if v == 2:
                        pushers[0].push(_restamp(groups[-1], 0))
                time.sleep(0.05)
        finally:
            for p in pushers:
                p.close()
    except BaseException as e:  # surfaced by the test
        errors.append(e)


@pytest.mark.e2e
def test_master_and_two_model_workers_train_three_steps_log_metrics_and_exit(
    redis_url, tmp_path, no_leftover_processes
):
    torch.set_num_threads(1)
    model, tok = load_tiny()
    groups = make_groups(model, tok, load_rows(B * STEPS + 1), group_size=GROUP)
    ppo = PPOHyperparameters(ppo_n_minibatches=2)
    worker_cfg = ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=TINY_SFT),
        ppo=ppo,
        run_dir=str(tmp_path),
        max_head_offpolicyness=ETA,
        total_train_steps=STEPS,
    )
    master_cfg = MasterWorkerConfig(
        n_model_workers=N_DP,
        groups_per_step=B,
        group_size=GROUP,
        ppo=ppo,
        total_train_steps=STEPS,
        exp_ctrl=ExperimentSaveEvalControl(benchmark_steps=STEPS),
        log_dir=str(tmp_path / "logs" / EXP / TRIAL),
        stats=StatsLoggingConfig(tensorboard_path=str(tmp_path / "tb"), log_completions=2),
        worker_connect_timeout=120,
    )
    launcher = LocalLauncher(
        EXP,
        TRIAL,
        str(tmp_path),
        NameResolveConfig(type="redis", redis_url=redis_url),
        startup_timeout=120,
        worker_template=shared_template.address(),
    )
    stop, errors = threading.Event(), []
    feeder = threading.Thread(target=_feed, args=(stop, groups, errors, launcher.secret), daemon=True)
    try:
        launcher.start()
        launcher.submit(WorkerSpec("master_worker", 1, configs=[master_cfg]))
        launcher.submit(WorkerSpec("model_worker", N_DP, configs=[worker_cfg] * N_DP))
        feeder.start()
        launcher.wait(timeout=240)  # returns only when every worker exited 0
    finally:
        stop.set()
        feeder.join(timeout=10)
        launcher.stop_all()
    assert not errors, errors

    lines = (tmp_path / "logs" / EXP / TRIAL / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]
    assert len(metrics) == STEPS
    for m in metrics:
        assert METRIC_KEYS <= m.keys(), METRIC_KEYS - m.keys()
    assert [m["step"] for m in metrics] == [1, 2, 3] and [m["version"] for m in metrics] == [1, 2, 3]
    assert all(m["reward_mean"] == 0 and m["success_rate"] == 0.5 for m in metrics)  # half right per group
    assert all(m["head_offpolicyness_max"] <= ETA for m in metrics)
    assert metrics[-1]["stale_dropped"] == 1  # the version-0 group pushed at version 2
    assert all(m["n_samples"] == B * GROUP and m["samples_per_s"] > 0 for m in metrics)

    assert name_resolve.get(names.model_version(EXP, TRIAL, "actor")) == "3"
    assert json.loads(name_resolve.get(names.stale_dropped(EXP, TRIAL))) == [1, 0]  # pushed to rank 0
    assert name_resolve.get(names.training_samples(EXP, TRIAL)) == str(B * STEPS)
    published = tmp_path / "published_weights" / "actor"
    assert sorted(p.name for p in published.iterdir()) == ["2", "3"]  # the last two versions
    assert (published / "3" / "model.safetensors").is_file()
    assert (tmp_path / "checkpoints" / "actor" / "version3" / "model.safetensors").is_file()
    assert any((tmp_path / "tb").iterdir())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()  # the master's events, read back: the same numbers as metrics.jsonl
    assert [(e.step, e.value) for e in events.Scalars("success_rate")] == [(1, 0.5), (2, 0.5), (3, 0.5)]
    assert [e.value for e in events.Scalars("reward_mean")] == [m["reward_mean"] for m in metrics]
    # stats.log_completions=2: DP rank 0 decoded the first sample of each of its two groups; the
    # text is exactly the pushed tokens' (sample 0 is the row's solution, graded right).
    by_qid = {g["qid"]: g for g in groups}
    shown = read_completions(str(tmp_path / "logs" / EXP / TRIAL))
    assert [r["step"] for r in shown] == [1, 1, 2, 2, 3, 3]
    for r in shown:
        sent = by_qid[r["qid"].rsplit("@", 1)[0]]
        assert r["prompt"] == tok.decode(sent["prompt_ids"], skip_special_tokens=True) != ""
        assert r["completion"] == tok.decode(sent["samples"][0]["output_ids"], skip_special_tokens=True) != ""
        assert r["reward"] == 1.0 and r["version_start"] == r["version_end"] == r["step"] - 1
