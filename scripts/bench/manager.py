"""GserverManager request rate: allocate → schedule → finish cycles from 64 concurrent clients.

    python -m scripts.bench.manager [--short] [--clients 64] [--seconds 20]

The manager runs as its own process (`serve_manager`, the real FastAPI app and watcher, with four
idle stand-in servers that only answer its health checks: routing never sends them work), so
that the clients and the server do not share a GIL. Admission is configured never to bind
(huge B), so every cycle is three successful requests. The client side is one asyncio process
with a kept-alive aiohttp session and `--clients` coroutines, each looping
allocate_rollout → schedule_request → finish_rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
import time

from scripts.bench.common import PYTHON, REPO, emit, log, print_tables


def fake_generation_server():
    """An idle stand-in that answers the manager's health checks (routing never sends it work)."""
    from fastapi import FastAPI

    from realhf.system.streams.http_thread import HttpServerThread

    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.get("/get_model_info")
    async def model_info():
        return {"weight_version": 0}

    return HttpServerThread(app, name="fake-gen-server").start()


def run_server(n_servers: int = 4) -> int:
    """Child: serve a manager, print its URL, stop when stdin closes."""
    from realhf.api.cli_args import NameResolveConfig
    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.base import logging, name_resolve, names
    from realhf.system.manager.gserver_manager import serve_manager

    logging.setup(level="WARNING")
    name_resolve.reconfigure(NameResolveConfig(type="memory"))
    fakes = [fake_generation_server() for _ in range(n_servers)]
    server = None
    try:
        # Registered like real servers: the manager routes to registered servers that answer /health.
        for f in fakes:
            name_resolve.add_subentry(names.gen_servers("bench", "manager"), f.url)
        cfg = GserverManagerConfig(
            max_concurrent_rollouts=10**6,
            groups_per_step=10**9,
            max_head_offpolicyness=0,
            n_servers=n_servers,
            log_interval=1e9,
        )
        server = serve_manager(cfg, "bench", "manager", server_urls=[f.url for f in fakes])
        print(server.url, flush=True)
        sys.stdin.read()  # the parent closes stdin when done
    finally:
        if server is not None:
            server.stop()
        for f in fakes:
            f.stop()
    return 0


async def clients(url: str, n_clients: int, seconds: float, warmup: float) -> dict:
    import aiohttp

    latencies = {"allocate": [], "schedule": [], "finish": []}
    counts = {"cycles": 0, "errors": 0}
    first_error = []
    t_start = time.perf_counter()
    t_measure, t_end = t_start + warmup, t_start + warmup + seconds

    async def post(session, path, body):
        t0 = time.perf_counter()
        async with session.post(url + path, json=body) as resp:
            data = await resp.json()
            ok = resp.status == 200
        return ok, data, time.perf_counter() - t0

    async def one_client(session, c: int):
        i = 0
        while time.perf_counter() < t_end:
            qid = f"c{c}-{i}"
            i += 1
            ok1, d1, l1 = await post(session, "/allocate_rollout", {"qid": qid, "rank": 0})
            if not (ok1 and d1.get("success")):
                counts["errors"] += 1
                first_error[:] = first_error or [f"allocate_rollout: {d1}"]
                continue
            ok2, d2, l2 = await post(
                session, "/schedule_request", {"qid": qid, "prompt_len": 30, "group_size": 8, "new_token_budget": 256}
            )
            ok3, d3, l3 = await post(session, "/finish_rollout", {"qid": qid, "accepted": True, "n_tokens": 128})
            if not (ok2 and ok3):
                counts["errors"] += 1
                first_error[:] = first_error or [f"schedule_request: {d2}; finish_rollout: {d3}"]
                continue
            if time.perf_counter() >= t_measure and time.perf_counter() < t_end:
                counts["cycles"] += 1
                for k, lat in zip(latencies, (l1, l2, l3)):
                    latencies[k].append(lat)

    connector = aiohttp.TCPConnector(limit=n_clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one_client(session, c) for c in range(n_clients)))
    if first_error:
        log(f"{counts['errors']} failed cycles; first: {first_error[0]}")
    return {"cycles": counts["cycles"], "errors": counts["errors"], "latencies": latencies, "seconds": seconds}


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def tables(r):
    return [
        (
            f"GserverManager: {r['clients']} concurrent aiohttp clients, {r['seconds']} s measured (after warm-up)",
            ["requests/s", "rollouts/s (3 requests each)", "p50 latency ms", "p99 latency ms", "errors"],
            [[r["requests_per_s"], r["rollouts_per_s"], r["p50_ms"], r["p99_ms"], r["errors"]]],
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.manager", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 3 s")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--role", default="bench", choices=["bench", "server"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "server":
        return run_server()
    if args.short:
        args.seconds, args.warmup = 3.0, 1.0

    proc = subprocess.Popen(
        [PYTHON, "-m", "scripts.bench.manager", "--role", "server"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        box = []
        reader = threading.Thread(target=lambda: box.append(proc.stdout.readline().strip()), daemon=True)
        reader.start()
        reader.join(timeout=120)
        if not box or not box[0].startswith("http"):
            raise RuntimeError(f"manager process did not print its URL within 120 s (got {box})")
        url = box[0]
        log(f"manager at {url}; {args.clients} clients for {args.seconds} s")
        res = asyncio.run(clients(url, args.clients, args.seconds, args.warmup))
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    all_lat = [x for v in res["latencies"].values() for x in v]
    result = {
        "bench": "manager",
        "clients": args.clients,
        "seconds": args.seconds,
        "requests_per_s": round(3 * res["cycles"] / args.seconds, 1),
        "rollouts_per_s": round(res["cycles"] / args.seconds, 1),
        "p50_ms": round(_pct(all_lat, 0.5) * 1000, 2),
        "p99_ms": round(_pct(all_lat, 0.99) * 1000, 2),
        "errors": res["errors"],
        **{f"{k}_p50_ms": round(_pct(v, 0.5) * 1000, 2) for k, v in res["latencies"].items()},
    }
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
