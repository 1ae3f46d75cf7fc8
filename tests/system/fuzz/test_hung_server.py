"""Issue 14, item 5: a generation server that is alive but hung is treated like a dead one.

Two native servers behind a real manager (HTTP + watcher, real Redis name resolve): one served
in this process, one a real GenerationServer worker process whose engine's decode steps block
forever (its engine thread lives and /health answers 200, so the manager cannot tell). Rollouts
keep finishing — requests sent to the hung server get no answer within `request_timeout` and
are resubmitted through the manager — and the hung worker's own liveness check (a no-op through
the engine thread, `health_timeout` s, `max_health_failures` in a row) makes it exit non-zero,
which is what the launcher's restart policy acts on; the manager then drops it from routing.
"""

import asyncio
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from helpers.manager_harness import EXP, TRIAL, running_manager
from helpers.native_server import SMALL_CONTEXT, SMALL_SLOTS, serve_native
from helpers.wait import wait_for

WORKER = os.path.join(os.path.dirname(__file__), "hung_server_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HEALTH_CHECK_INTERVAL, HEALTH_TIMEOUT, MAX_FAILURES = 0.5, 1.0, 2
# Exit within: the failed checks, the engine's stop (1 s for a hung thread), slack.
EXIT_BOUND_S = MAX_FAILURES * (HEALTH_CHECK_INTERVAL + HEALTH_TIMEOUT) + 1 + 15
GCONFIG = SimpleNamespace(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=-1, stop_token_ids=[], min_new_tokens=0)


async def _rollouts(manager_url, n_groups, group_size):
    from realhf.system.rollout.generation_client import GenerationClient

    async with GenerationClient(manager_url, request_timeout=3.0, server_wait_timeout=60.0) as client:

        async def one(i):
            qid = f"hung-test-{i}"
            ok, reason = await client.manager.allocate_rollout(qid, 0)
            assert ok, reason
            results = await client.generate_group(qid, [5, 6, 7, 8], GCONFIG, group_size)
            client.forget(qid)
            await client.manager.finish_rollout(qid, True, sum(len(r.output_ids) for r in results))
            return results

        groups = await asyncio.gather(*(one(i) for i in range(n_groups)))
        return groups, client.n_timeouts, client.n_unavailable + client.n_aborts


def test_hung_server_is_routed_around_and_exits_nonzero(nr, redis_name_resolve, tiny_model_path, tmp_path):
    from realhf.base import name_resolve, names
    from realhf.system.worker_base import STATUS_RUNNING

    name_resolve.add(names.experiment_status(EXP, TRIAL), STATUS_RUNNING, replace=True)
    args = {
        "experiment": EXP,
        "trial": TRIAL,
        "redis_url": redis_name_resolve.redis_url,
        "model_path": tiny_model_path,
        "slots": SMALL_SLOTS,
        "context": SMALL_CONTEXT,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
        "health_timeout": HEALTH_TIMEOUT,
        "max_health_failures": MAX_FAILURES,
    }
    log_path = tmp_path / "hung_worker.log"
    env = {**os.environ, "PYTHONPATH": ROOT}
    with open(log_path, "w") as log, serve_native(tiny_model_path, SMALL_CONTEXT, SMALL_SLOTS) as (good_url, _):
        worker = subprocess.Popen(
            [sys.executable, WORKER, json.dumps(args)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        try:
            hung_url = wait_for(
                lambda: name_resolve.get_subtree(names.gen_servers(EXP, TRIAL)),
                90,
                "the hung worker to register",
                interval=0.2,
            )[0]
            with running_manager(
                [good_url],
                health_check_interval=HEALTH_CHECK_INTERVAL,
                health_timeout=HEALTH_TIMEOUT,
                max_health_failures=MAX_FAILURES,
                max_concurrent_rollouts=64,
                groups_per_step=64,
                max_head_offpolicyness=64,
            ) as manager:
                service = manager.service
                wait_for(
                    lambda: set(service.router.servers()) == {good_url, hung_url},
                    30,
                    "the manager to route to both servers",
                )
                t0 = time.monotonic()
                groups, n_resubmitted, n_other = asyncio.run(_rollouts(manager.url, n_groups=8, group_size=2))
                rollouts_s = time.monotonic() - t0

                assert len(groups) == 8 and all(len(r.output_ids) >= 1 for g in groups for r in g)
                assert n_resubmitted + n_other > 0, "no request reached the hung server; the test proves nothing"
                status = service.status()
                assert status["running"] == 0 and status["throughput"]["finished"] == 8

                code = worker.wait(timeout=EXIT_BOUND_S)
                exit_s = time.monotonic() - t0
                assert code != 0, f"the hung worker exited with {code}"
                wait_for(lambda: hung_url not in service.router.servers(), 30, "the manager to drop the hung server")
                # More rollouts: all through the healthy server now.
                groups, n_timeouts, _ = asyncio.run(_rollouts(manager.url, n_groups=4, group_size=2))
                assert n_timeouts == 0 and all(len(r.output_ids) >= 1 for g in groups for r in g)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    text = log_path.read_text()
    assert "is hung" in text and "liveness check" in text, text[-3000:]
    print(
        f"rollouts finished in {rollouts_s:.1f}s ({n_resubmitted} timed-out requests resubmitted); "
        f"hung worker exited with {code} {exit_s:.1f}s after the first request"
    )
