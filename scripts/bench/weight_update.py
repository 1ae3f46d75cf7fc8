"""Weight-update latency, disk against distributed: a new version → every generation server serving it.

    python -m scripts.bench.weight_update [--short] [--n-servers 1,2,4] [--repeats 5] [--models tiny,smollm2,qwen2-0.5b]

Real processes: native generation servers (`python -m realhf.launch_server`), a real Redis name
resolve, the trainer's side replayed in this process, per version v and for each path:

- disk (`weight_sync=disk`): the engine's `save_hf` writes `published_weights/actor/<v>` (the
  trainer pays it before it announces the version), then `model_version/actor = v` is set and the
  GserverManager's watcher (`serve_manager`, in this process) updates the servers one at a time;
  the clock runs until every server's `GET /get_model_info` reports v (polled every 10 ms);
- distributed (`weight_sync=distributed`): `WeightBroadcaster.publish` (the trainer's rank 0)
  sends the weights to every server at once over a gloo group; the clock is the publish call
  (the servers answer after swapping v in). The first version builds the group and is reported
  apart; the median is over the others.

Models: the tiny-math SFT model (0.55M), SmolLM2-135M (assets/smollm2-135m-instruct, where
`examples/run_async_ppo_smollm2.sh` has converted it) and a random Qwen2 of Qwen2-0.5B's shape
(0.49B, fp32: 2 GB a copy; at most 2 servers, as 4 would not fit in 24 GiB with their staging).
Short mode: the tiny model and a ≈12M random Qwen2, 1 and 2 servers. Servers are idle: this is
the update path itself, not its interference with decoding.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from scripts.bench.common import PYTHON, REPO, emit, log, print_tables

EXP, TRIAL = "bench", "weight-update"

LARGE = dict(
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
)  # ≈100M parameters
MEDIUM = dict(
    vocab_size=8192,
    hidden_size=384,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=6,
    num_key_value_heads=2,
)  # ≈12M parameters (short mode)


def make_random_qwen2(path: str, dims: dict, seed: int = 1):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        **dims, max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=2
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path, safe_serialization=True)
    return model


class ServerProcess:
    """One `realhf.launch_server` child; its stderr is drained by a thread (and scanned for the URL)."""

    def __init__(self, model_path: str):
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "realhf.launch_server",
                "--model-path",
                model_path,
                "--port",
                "0",
                "--max-running-requests",
                "8",
                "--context-length",
                "256",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url = None
        self.tail = []
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.tail = (self.tail + [line])[-20:]
            if "ready at " in line and self.url is None:
                self.url = line.rsplit("ready at ", 1)[1].strip()
                self._ready.set()
        self._ready.set()

    def wait_ready(self, timeout: float) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            raise RuntimeError(
                f"generation server did not print 'ready at' within {timeout:.0f} s; stderr tail: {''.join(self.tail)}"
            )
        return self.url

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def served_version(url: str) -> int:
    with urllib.request.urlopen(f"{url}/get_model_info", timeout=10) as r:
        return int(json.loads(r.read())["weight_version"])


QWEN2_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
)


def measure_model(model, model_path: str, n_servers: int, repeats: int, fileroot: str) -> dict:
    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.base import name_resolve, names
    from realhf.base.trial_files import published_version_dir, published_weights_dir
    from realhf.impl.model.checkpoint import prune_versions, save_hf_dir
    from realhf.system.manager.gserver_manager import serve_manager

    servers = [ServerProcess(model_path) for _ in range(n_servers)]
    manager = None
    try:
        urls = [s.wait_ready(300) for s in servers]
        for url in urls:  # registered as the GenerationServer worker does: the manager routes to these
            name_resolve.add_subentry(names.gen_servers(EXP, TRIAL), url)
        cfg = GserverManagerConfig(run_dir=fileroot, n_servers=n_servers, log_interval=1e9)
        manager = serve_manager(cfg, EXP, TRIAL, server_urls=urls)
        key = names.model_version(EXP, TRIAL, "actor")
        publish_s, latency_s = [], []
        for v in range(1, repeats + 1):
            t0 = time.perf_counter()
            # What the model worker does at DP=1 (its engine's save_hf writes through save_hf_dir).
            save_hf_dir(model, published_version_dir(fileroot, "actor", v), tokenizer_source=None)
            prune_versions(published_weights_dir(fileroot, "actor"), keep=2, current=v)
            publish_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            name_resolve.add(key, str(v), replace=True)
            pending = set(urls)
            deadline = time.monotonic() + 300
            while pending:
                manager.check()
                pending = {u for u in pending if served_version(u) < v}
                if time.monotonic() > deadline:
                    raise TimeoutError(f"servers {sorted(pending)} did not reach weight_version {v} within 300 s")
                if pending:
                    time.sleep(0.01)
            latency_s.append(time.perf_counter() - t0)
            log(
                f"disk v{v}: publish {publish_s[-1]:.3f} s, model_version -> all {n_servers} servers {latency_s[-1]:.3f} s"
            )
        # The same servers, the next versions, broadcast from here as the trainer's rank 0 does.
        from realhf.system.trainer.weight_broadcast import WeightBroadcaster

        b = WeightBroadcaster(lambda: list(urls), "127.0.0.1", "gloo", 600.0, 256 * 2**20, pause=False)
        broadcast_s = []
        try:
            for v in range(repeats + 1, 2 * repeats + 2):
                r = b.publish(v, model.state_dict().items())
                if not r.ok:
                    raise RuntimeError(f"broadcast of version {v} failed: {r.failed}")
                broadcast_s.append(r.seconds)
                got = {served_version(u) for u in urls}
                if got != {v}:
                    raise RuntimeError(f"after the broadcast of version {v} the servers report {got}")
                log(f"distributed v{v}: all {n_servers} servers {r.seconds:.3f} s ({r.n_buckets} buckets)")
        finally:
            b.close()
        return {
            "publish_s": publish_s,
            "latency_s": latency_s,
            "poll_interval_s": cfg.poll_interval,
            "broadcast_first_s": broadcast_s[0],
            "broadcast_s": broadcast_s[1:],
        }
    finally:
        if manager is not None:
            manager.stop()
        for s in servers:
            s.stop()
        name_resolve.clear_subtree(f"{EXP}/{TRIAL}")
        import shutil

        shutil.rmtree(published_weights_dir(fileroot, "actor"), ignore_errors=True)


def tables(r):
    rows = []
    for row in r["rows"]:
        rows.append(
            [
                row["model"],
                f"{row['params'] / 1e6:.1f}M",
                row["n_servers"],
                row["disk_save_median_s"],
                row["disk_update_median_s"],
                round(row["disk_save_median_s"] + row["disk_update_median_s"], 4),
                row["distributed_median_s"],
                row["distributed_first_s"],
            ]
        )
    return [
        (
            f"weight update, disk vs distributed (gloo, one machine), idle native servers, median of {r['repeats']} versions",
            [
                "model",
                "params",
                "servers",
                "disk: save s",
                "disk: announce -> all servers s",
                "disk total s",
                "distributed: all servers s",
                "distributed: first version (group built) s",
            ],
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.weight_update", description=__doc__.split("\n")[0])
    p.add_argument(
        "--short", action="store_true", help="smoke mode: the tiny model and a ≈12M one, 1 and 2 servers, 2 versions"
    )
    p.add_argument("--n-servers", default="1,2,4", help="server counts, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="versions published per model, path and server count")
    p.add_argument("--models", default="tiny,smollm2,qwen2-0.5b", help="which models, comma-separated")
    p.add_argument("--tiny-path", default=os.path.join(REPO, "assets", "tiny-math", "sft"))
    p.add_argument("--smollm2-path", default=os.path.join(REPO, "assets", "smollm2-135m-instruct"))
    args = p.parse_args(argv)
    counts = [int(x) for x in args.n_servers.split(",")]
    models = args.models.split(",")
    if args.short:
        counts, args.repeats, models = [1, 2], 2, ["tiny", "medium"]

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve
    from realhf.base.redis_server import RedisServer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    result = {"bench": "weight_update", "repeats": args.repeats, "rows": []}
    with tempfile.TemporaryDirectory(prefix="bench_weight_update_") as tmp, RedisServer.with_random_password() as redis:
        name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=redis.url))
        try:
            for name in models:
                if name == "tiny":
                    path = args.tiny_path
                    model = AutoModelForCausalLM.from_pretrained(path)
                elif name == "smollm2":
                    path = args.smollm2_path
                    if not os.path.isfile(os.path.join(path, "config.json")):
                        log(f"smollm2: {path} not there (bash examples/run_async_ppo_smollm2.sh converts it); skipped")
                        continue
                    model = AutoModelForCausalLM.from_pretrained(path)
                else:
                    path = os.path.join(tmp, name)
                    model = make_random_qwen2(path, {"medium": MEDIUM, "qwen2-0.5b": QWEN2_05B}[name])
                params = sum(t.numel() for t in model.parameters())
                for n in counts:
                    if params > 3e8 and n > 2:
                        log(f"{name}: {n} servers skipped (each holds the fp32 model twice while it swaps)")
                        continue
                    log(f"{name}: {params / 1e6:.1f}M params, {n} servers")
                    m = measure_model(model, path, n, args.repeats, os.path.join(tmp, "fileroot"))
                    result["poll_interval_s"] = m["poll_interval_s"]
                    result["rows"].append(
                        {
                            "model": name,
                            "params": params,
                            "n_servers": n,
                            "disk_save_median_s": round(statistics.median(m["publish_s"]), 4),
                            "disk_update_median_s": round(statistics.median(m["latency_s"]), 4),
                            "disk_update_s": [round(x, 4) for x in m["latency_s"]],
                            "distributed_median_s": round(statistics.median(m["broadcast_s"]), 4),
                            "distributed_first_s": round(m["broadcast_first_s"], 4),
                            "distributed_s": [round(x, 4) for x in m["broadcast_s"]],
                        }
                    )
                del model
        finally:
            name_resolve.repository().reset()
            name_resolve.reconfigure(NameResolveConfig(type="memory"))
    tiny = [r for r in result["rows"] if r["model"] == "tiny"]
    if tiny:
        result["tiny_model_update_s"] = tiny[0]["disk_update_median_s"]
        result["tiny_model_distributed_s"] = tiny[0]["distributed_median_s"]
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
