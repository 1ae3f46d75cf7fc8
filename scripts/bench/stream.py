"""Trajectory stream throughput: NameResolvingZmqPusher → StreamDataset vs raw ZMQ bytes.

    python -m scripts.bench.stream [--short] [--n-msgs 400] [--n-raw-msgs 2000] [--tokens 2048]

One message is one realistic prompt group as the rollout worker sends it (`Trajectory.to_msg()`:
8 samples × 2048 output tokens with per-token log-probs and versions, a 256-token prompt). A
separate pusher process finds the puller through a real Redis name resolve and pushes `--n-msgs`
groups (calling `to_msg()` per group, as the rollout worker does); this process receives them
through a `StreamDataset` that validates each with `Trajectory.from_msg`, as the model worker's
does. The raw baseline pushes pre-built random byte payloads of the same size through plain ZMQ
PUSH/PULL between the same two kinds of process. Rates count from the first message received
to the last (process start-up excluded). Also prints the per-message cost of each conversion
step measured in one process, to show where the stream's time goes.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from scripts.bench.common import PYTHON, REPO, emit, log, print_tables

EXP, TRIAL = "bench", "stream"
DONE_KEY = f"{EXP}/{TRIAL}/bench_done"


def make_trajectory_lists(n_samples: int, n_tokens: int, prompt_len: int, seed: int = 1):
    """The fields of a group as an agent collects them from the generation servers' JSON."""
    rng = random.Random(seed)
    samples = [
        dict(
            output_ids=[rng.randrange(150000) for _ in range(n_tokens)],
            logprobs=[-rng.random() * 5 for _ in range(n_tokens)],
            versions=[3] * (n_tokens // 2) + [4] * (n_tokens - n_tokens // 2),
            reward=rng.choice([-1.0, 1.0]),
            no_eos=False,
        )
        for _ in range(n_samples)
    ]
    return dict(
        qid="q-0",
        prompt_ids=[rng.randrange(150000) for _ in range(prompt_len)],
        samples=samples,
        metadata={"answer": "42"},
    )


def build_trajectory(fields: dict):
    """The Trajectory an agent builds from those lists (token fields become arrays here, once)."""
    from realhf.api.trajectory import Sample, Trajectory

    return Trajectory(
        qid=fields["qid"],
        prompt_ids=fields["prompt_ids"],
        samples=[Sample(**s) for s in fields["samples"]],
        metadata=dict(fields["metadata"]),
    )


def make_trajectory(n_samples: int, n_tokens: int, prompt_len: int, seed: int = 1):
    return build_trajectory(make_trajectory_lists(n_samples, n_tokens, prompt_len, seed))


# ---- child processes ---------------------------------------------------------------------------
def run_pusher(args) -> int:
    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve
    from realhf.system.streams.push_pull_stream import NameResolvingZmqPusher

    name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=args.redis_url))
    traj = make_trajectory(args.group, args.tokens, args.prompt_len)
    pusher = NameResolvingZmqPusher(EXP, TRIAL, 0, 1, 1, discovery_timeout=60)
    for i in range(args.n_msgs):
        traj.qid = f"q-{i}"
        pusher.push(traj.to_msg())
    # Close only after the puller has everything: ZMQ would drop what is still queued after LINGER.
    name_resolve.wait(DONE_KEY, timeout=600)
    pusher.close()
    return 0


def run_raw_pusher(args) -> int:
    import os

    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve
    from realhf.system.streams.push_pull_stream import ZMQPusher

    name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=args.redis_url))
    payload = os.urandom(args.size)
    pusher = ZMQPusher(args.address)
    for _ in range(args.n_msgs):
        pusher.push_bytes(payload)
    name_resolve.wait(DONE_KEY + "_raw", timeout=600)
    pusher.close()
    return 0


# ---- the measuring side ------------------------------------------------------------------------
def _spawn(role_args):
    import subprocess

    return subprocess.Popen([PYTHON, "-m", "scripts.bench.stream", *role_args], cwd=REPO)


def _stop(proc, what: str):
    try:
        proc.wait(timeout=60)
    except Exception:  # noqa: BLE001 - a stuck child is killed, never left behind
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what} process did not exit within 60 s after the run") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what} process exited with {proc.returncode}")


def measure_stream(redis_url: str, args) -> float:
    """msgs/s through NameResolvingZmqPusher (other process) → StreamDataset(parse=from_msg)."""
    from realhf.api.trajectory import Trajectory
    from realhf.base import name_resolve
    from realhf.system.streams.push_pull_stream import NameResolvingZmqPuller
    from realhf.system.trainer.stream_dataset import StreamDataset

    name_resolve.clear_subtree(f"{EXP}/{TRIAL}")
    puller = NameResolvingZmqPuller(EXP, TRIAL, 0)
    dataset = StreamDataset(puller, parse=Trajectory.from_msg, name="bench-stream")
    proc = _spawn(
        [
            "--role",
            "pusher",
            "--redis-url",
            redis_url,
            "--n-msgs",
            str(args.n_msgs),
            "--tokens",
            str(args.tokens),
            "--group",
            str(args.group),
            "--prompt-len",
            str(args.prompt_len),
        ]
    )
    try:
        dataset.get(1, timeout=120)
        t0 = time.perf_counter()
        dataset.get(args.n_msgs - 1, timeout=600)
        elapsed = time.perf_counter() - t0
        name_resolve.add(DONE_KEY, "1", replace=True)
        _stop(proc, "pusher")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        dataset.close()
    return (args.n_msgs - 1) / elapsed


def measure_raw(redis_url: str, size: int, args) -> float:
    from realhf.base import name_resolve
    from realhf.system.streams.push_pull_stream import ZMQPuller

    puller = ZMQPuller()
    proc = _spawn(
        [
            "--role",
            "raw-pusher",
            "--redis-url",
            redis_url,
            "--address",
            puller.address,
            "--n-msgs",
            str(args.n_raw_msgs),
            "--size",
            str(size),
        ]
    )
    try:
        puller.pull_bytes(timeout=120)
        t0 = time.perf_counter()
        for _ in range(args.n_raw_msgs - 1):
            puller.pull_bytes(timeout=120)
        elapsed = time.perf_counter() - t0
        name_resolve.add(DONE_KEY + "_raw", "1", replace=True)
        _stop(proc, "raw pusher")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        puller.close()
    return (args.n_raw_msgs - 1) / elapsed


def conversion_costs(fields: dict, n: int) -> dict:
    """Seconds per message of each step of the stream, measured in this process, and of the
    agent building its Trajectory from lists (not part of the stream: once per group, upstream)."""
    from realhf.api.trajectory import Trajectory
    from realhf.base import serialization

    def per_call(fn):
        t0 = time.perf_counter()
        for _ in range(n):
            out = fn()
        return (time.perf_counter() - t0) / n, out

    build_s, traj = per_call(lambda: build_trajectory(fields))
    to_msg_s, msg = per_call(traj.to_msg)
    dumps_s, data = per_call(lambda: serialization.dumps(msg))
    loads_s, back = per_call(lambda: serialization.loads(data))
    from_msg_s, _ = per_call(lambda: Trajectory.from_msg(back))
    return {"build_s": build_s, "to_msg_s": to_msg_s, "dumps_s": dumps_s, "loads_s": loads_s, "from_msg_s": from_msg_s}


def tables(r):
    return [
        (
            f"trajectory stream: {r['group']} samples x {r['tokens']} tokens per message, {r['msg_bytes'] / 1e6:.3f} MB "
            f"msgpack, best of {r['repeats']}",
            ["path", "msgs/s", "MB/s"],
            [
                ["NameResolvingZmqPusher -> StreamDataset", r["stream_msgs_per_s"], r["stream_mb_per_s"]],
                ["raw ZMQ PUSH/PULL, same bytes", r["raw_msgs_per_s"], r["raw_mb_per_s"]],
                ["ratio stream / raw", r["stream_over_raw_mb_per_s"], r["stream_over_raw_mb_per_s"]],
            ],
        ),
        (
            "per-message cost of each conversion (one process, ms); the agent's Trajectory from lists is "
            "upstream of the stream",
            [
                "agent: Trajectory from lists",
                "Trajectory.to_msg",
                "msgpack dumps",
                "msgpack loads",
                "Trajectory.from_msg",
            ],
            [[r["build_ms"], r["to_msg_ms"], r["dumps_ms"], r["loads_ms"], r["from_msg_ms"]]],
        ),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.stream", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 30 groups, 300 raw messages, 1 repeat")
    p.add_argument("--n-msgs", type=int, default=400, help="trajectory messages per stream run")
    p.add_argument("--n-raw-msgs", type=int, default=3000, help="messages per raw run")
    p.add_argument("--tokens", type=int, default=2048, help="output tokens per sample")
    p.add_argument("--group", type=int, default=8, help="samples per message (group size)")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=2, help="interleaved runs per side; the best counts")
    # child-process roles (internal)
    p.add_argument("--role", default="bench", choices=["bench", "pusher", "raw-pusher"], help=argparse.SUPPRESS)
    p.add_argument("--redis-url", default="", help=argparse.SUPPRESS)
    p.add_argument("--address", default="", help=argparse.SUPPRESS)
    p.add_argument("--size", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "pusher":
        return run_pusher(args)
    if args.role == "raw-pusher":
        return run_raw_pusher(args)
    if args.short:
        args.n_msgs, args.n_raw_msgs, args.repeats = 30, 300, 1

    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve, serialization
    from realhf.base.redis_server import RedisServer

    fields = make_trajectory_lists(args.group, args.tokens, args.prompt_len)
    size = len(serialization.dumps(build_trajectory(fields).to_msg()))
    costs = conversion_costs(fields, 3 if args.short else 20)
    stream = raw = 0.0
    with RedisServer.with_random_password() as redis:
        name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=redis.url))
        try:
            for i in range(args.repeats):
                # Interleaved, best of each: a load burst then hits both sides.
                raw = max(raw, measure_raw(redis.url, size, args))
                stream = max(stream, measure_stream(redis.url, args))
                log(f"stream repeat {i + 1}: raw {raw:.0f} msgs/s, stream {stream:.1f} msgs/s (best so far)")
                name_resolve.clear_subtree(f"{EXP}/{TRIAL}")
        finally:
            name_resolve.repository().reset()
            name_resolve.reconfigure(NameResolveConfig(type="memory"))
    mb = size / 1e6
    result = {
        "bench": "stream",
        "group": args.group,
        "tokens": args.tokens,
        "msg_bytes": size,
        "n_msgs": args.n_msgs,
        "n_raw_msgs": args.n_raw_msgs,
        "repeats": args.repeats,
        "stream_msgs_per_s": round(stream, 2),
        "stream_mb_per_s": round(stream * mb, 2),
        "raw_msgs_per_s": round(raw, 1),
        "raw_mb_per_s": round(raw * mb, 1),
        "stream_over_raw_mb_per_s": round(stream / raw, 4),
        **{k.replace("_s", "_ms"): round(v * 1000, 3) for k, v in costs.items()},
    }
    print_tables(tables(result))
    print(f"stream / raw: {result['stream_over_raw_mb_per_s']:.3f}x (target >= 0.5x)")
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
