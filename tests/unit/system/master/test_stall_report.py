"""The stall report: what the master says while no train step completes (manager state, dead
servers, missing workers), checked over real HTTP and real Redis."""

import pytest

from realhf.base import name_resolve, names

pytestmark = pytest.mark.system


def test_stall_report_names_manager_state_dead_servers_and_missing_workers(redis_name_resolve):
    """Real HTTP: a manager on loopback, one healthy generation server stand-in and one URL nobody
    listens on; heartbeats for one of two rollout workers."""
    from fastapi import FastAPI

    from realhf.base.network import find_free_port
    from realhf.system.manager.gserver_manager import serve_manager
    from realhf.system.master.stall_report import stall_report
    from realhf.system.streams.http_thread import HttpServerThread

    health = FastAPI()
    health.get("/health")(lambda: {"ok": True})
    server = HttpServerThread(health, host="127.0.0.1", name="health-standin").start()
    dead = f"http://127.0.0.1:{find_free_port()}"
    from helpers.manager_harness import manager_config

    config = manager_config(n_trainer_ranks=2, groups_per_step=4, max_concurrent_rollouts=8, max_head_offpolicyness=0)
    name_resolve.clear_subtree(names.admission_ledger("stall", "t"))
    manager = serve_manager(config, "stall", "t", server_urls=[server.url, dead])
    try:
        name_resolve.add(names.gserver_manager("stall", "t"), manager.url, replace=True)
        for url in (server.url, dead):
            name_resolve.add_subentry(names.gen_servers("stall", "t"), url)
        name_resolve.add(names.worker("stall", "t", "rollout_worker", 0), "host:1", replace=True)
        manager.service.allocate("q1", 1)
        manager.service.admission.allocate("q1", 1)  # a duplicate: counted as a rejection by reason
        replies = [{"dp_rank": 0, "buffered": 1, "stale_dropped": 0, "received": 1, "invalid": 0}]
        lines = stall_report("stall", "t", replies, [4], {"rollout_worker": 2})
    finally:
        manager.stop()
        server.stop()
    text = "\n".join(lines)
    assert "dp rank 0: holds 1/4 groups" in text
    assert f"manager {manager.url}: version 0, running 1" in text and "duplicate_qid 1" in text
    assert "capacity 3 (per DP rank [2, 1])" in text  # shares [2, 2], η = 0; rank 1 runs one
    assert f"generation server {server.url}: healthy" in text
    assert f"generation server {dead}: /health failed: unreachable" in text
    assert "rollout_worker 1/2 alive (missing [1])" in text
