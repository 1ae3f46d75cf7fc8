"""Weight-update latency: `model_version` published → every generation server serving it.

    python -m scripts.bench.weight_update [--short] [--n-servers 2] [--repeats 5]

Real processes and the real path of docs/architecture.md §5: native generation servers
(`python -m realhf.launch_server`), the GserverManager's HTTP app and watcher (`serve_manager`,
default poll interval) in this process, a real Redis name resolve. Per version v the trainer's
side is replayed: the engine's `save_hf` writes `published_weights/actor/<v>` (timed separately: the
trainer pays it before it publishes), then `model_version/actor = v` is set and the clock runs
until every server's `GET /get_model_info` reports `weight_version == v` (polled every 10 ms).
Models: the tiny-math SFT model (0.55M) and a random Qwen2 of ≈100M parameters (short mode:
≈12M). Servers are idle: this is the update path itself, not its interference with decoding.
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
            log(f"v{v}: publish {publish_s[-1]:.3f} s, model_version -> all {n_servers} servers {latency_s[-1]:.3f} s")
        return {"publish_s": publish_s, "latency_s": latency_s, "poll_interval_s": cfg.poll_interval}
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
    for name in ("tiny", "large"):
        m = r[name]
        rows.append([name, f"{m['params'] / 1e6:.1f}M", m["publish_median_s"], m["update_median_s"], m["update_max_s"]])
    return [
        (
            f"weight update to {r['n_servers']} native server(s), manager poll interval {r['poll_interval_s']} s, "
            f"median of {r['repeats']} versions",
            ["model", "params", "publish (save) s", "model_version -> all servers s", "max s"],
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.weight_update", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="smoke mode: 1 server, 2 versions, a ≈12M model as 'large'")
    p.add_argument("--n-servers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="versions published per model")
    p.add_argument("--tiny-path", default=os.path.join(REPO, "assets", "tiny-math", "sft"))
    args = p.parse_args(argv)
    if args.short:
        args.n_servers, args.repeats = 1, 2

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve
    from realhf.base.redis_server import RedisServer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    result = {"bench": "weight_update", "n_servers": args.n_servers, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="bench_weight_update_") as tmp, RedisServer.with_random_password() as redis:
        name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=redis.url))
        try:
            tiny = AutoModelForCausalLM.from_pretrained(args.tiny_path)
            large_path = os.path.join(tmp, "large")
            large = make_random_qwen2(large_path, MEDIUM if args.short else LARGE)
            for name, model, path in (("tiny", tiny, args.tiny_path), ("large", large, large_path)):
                log(f"{name}: {sum(t.numel() for t in model.parameters()) / 1e6:.1f}M params, {args.n_servers} servers")
                m = measure_model(model, path, args.n_servers, args.repeats, os.path.join(tmp, "fileroot"))
                result["poll_interval_s"] = m["poll_interval_s"]
                result[name] = {
                    "params": sum(t.numel() for t in model.parameters()),
                    "publish_median_s": round(statistics.median(m["publish_s"]), 4),
                    "update_median_s": round(statistics.median(m["latency_s"]), 4),
                    "update_max_s": round(max(m["latency_s"]), 4),
                    "update_s": [round(x, 4) for x in m["latency_s"]],
                }
        finally:
            name_resolve.repository().reset()
            name_resolve.reconfigure(NameResolveConfig(type="memory"))
    result["tiny_model_update_s"] = result["tiny"]["update_median_s"]
    result["large_model_update_s"] = result["large"]["update_median_s"]
    result["large_model_params"] = result["large"]["params"]
    print_tables(tables(result))
    print(f"tiny model: {result['tiny_model_update_s']:.3f} s (target <= 0.5 s)")
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
