"""The master's bookkeeping without processes: DP shares, the stop rule, and what it says while
it waits for data (a fake request stream stands in for the model workers)."""

import logging
import time

import pytest

from realhf.api.cli_args import ExperimentSaveEvalControl
from realhf.api.worker_configs import MasterWorkerConfig
from realhf.base import name_resolve, names
from realhf.system.master_worker import MasterWorker, dp_shares
from realhf.system.stats_logger import format_line, step_metrics
from realhf.system.worker_base import WorkerContext


def test_each_dp_rank_gets_its_share_of_b_with_the_remainder_to_the_first_ranks():
    assert dp_shares(16, 2) == [8, 8]
    assert dp_shares(10, 4) == [3, 3, 2, 2]


def test_benchmark_steps_win_over_epochs_and_an_epoch_is_dataset_size_over_b():
    from realhf.api.cli_args import AsyncPPOMATHConfig
    from realhf.experiments.async_ppo_math import total_train_steps

    cfg = AsyncPPOMATHConfig(groups_per_step=16, exp_ctrl=ExperimentSaveEvalControl(total_train_epochs=2))
    assert total_train_steps(cfg, n_rows=100) == 12  # 100 // 16 = 6 steps per epoch
    cfg.exp_ctrl.benchmark_steps = 5
    assert total_train_steps(cfg, n_rows=100) == 5


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
    ctx = WorkerContext(experiment_name="mlogic", trial_name="t", worker_type="master_worker",
                        name_resolve=redis_name_resolve)
    cfg = MasterWorkerConfig(n_model_workers=2, groups_per_step=4, data_poll_interval=0.02, data_log_interval=0.05,
                             stall_timeout=0.1, data_timeout=0.4)
    w = MasterWorker(ctx, cfg)
    w._stream, w.shares, w.step, w.version, w.stale_dropped = _FakeStream(), [2, 2], 0, 0, -1
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
    # Stale drops reported by the ranks are published for the manager while the master waits.
    assert name_resolve.get(names.stale_dropped("mlogic", "t")) == "1"


def test_step_metrics_merge_the_ranks_staleness_rewards_and_throughput():
    fetch = [
        {"batch": {"n_groups": 1, "n_samples": 2, "reward_sum": 1.0, "n_success": 2, "n_no_eos": 0,
                   "gen_tokens": 30, "output_tokens": 30, "head_offpolicyness": [2], "tail_offpolicyness": [1]}},
        {"batch": {"n_groups": 1, "n_samples": 2, "reward_sum": -1.0, "n_success": 0, "n_no_eos": 1,
                   "gen_tokens": 10, "output_tokens": 10, "head_offpolicyness": [0], "tail_offpolicyness": [0]}},
    ]
    train = [{"version": 5, "stats": {"loss": 0.5}, "train_time_s": 1.0}] * 2
    m = step_metrics(3, 5, fetch, train, {}, stale_dropped=4, step_time_s=2.0, wait_time_s=0.5, training_samples=6)
    assert m["reward_mean"] == 0.0 and m["success_rate"] == 0.5 and m["no_eos_rate"] == 0.25
    assert (m["head_offpolicyness_mean"], m["head_offpolicyness_max"]) == (1.0, 2)
    assert (m["tail_offpolicyness_mean"], m["tail_offpolicyness_max"]) == (0.5, 1)
    assert m["samples_per_s"] == 2.0 and m["gen_tokens_per_s"] == 20.0 and m["loss"] == 0.5
    line = format_line(m)
    assert line.startswith("[bold]step 3[/bold] v5") and "head_stale 1.00 | /max 2" in line and "dropped 4" in line


def test_stall_report_names_manager_state_dead_servers_and_missing_workers(redis_name_resolve):
    """Real HTTP: a manager on loopback, one healthy generation server stand-in and one URL nobody
    listens on; heartbeats for one of two rollout workers."""
    from fastapi import FastAPI

    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.base.network import find_free_port
    from realhf.system.gserver_manager import serve_manager
    from realhf.system.http_thread import HttpServerThread
    from realhf.system.stall_report import stall_report

    health = FastAPI()
    health.get("/health")(lambda: {"ok": True})
    server = HttpServerThread(health, host="127.0.0.1", name="health-standin").start()
    dead = f"http://127.0.0.1:{find_free_port()}"
    manager = serve_manager(GserverManagerConfig(groups_per_step=4, max_concurrent_rollouts=8), "stall", "t",
                            server_urls=[server.url, dead])
    try:
        name_resolve.add(names.gserver_manager("stall", "t"), manager.url, replace=True)
        for url in (server.url, dead):
            name_resolve.add_subentry(names.gen_servers("stall", "t"), url)
        name_resolve.add(names.worker("stall", "t", "rollout_worker", 0), "host:1", replace=True)
        manager.service.allocate("q1")
        manager.service.admission.allocate("q1")  # a duplicate: counted as a rejection by reason
        replies = [{"dp_rank": 0, "buffered": 1, "stale_dropped": 0, "received": 1, "invalid": 0}]
        lines = stall_report("stall", "t", replies, [4], {"rollout_worker": 2})
    finally:
        manager.stop()
        server.stop()
    text = "\n".join(lines)
    assert "dp rank 0: holds 1/4 groups" in text
    assert f"manager {manager.url}: version 0, running 1" in text and "duplicate_qid 1" in text
    assert f"generation server {server.url}: healthy" in text
    assert f"generation server {dead}: /health failed: unreachable" in text
    assert "rollout_worker 1/2 alive (missing [1])" in text
