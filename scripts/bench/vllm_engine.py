"""The built-in engine against vLLM's CPU build, each behind realhf's server, over HTTP (issue 46).

    python -m scripts.bench.vllm_engine [--short] [--models tiny,smollm2] [--rows 8,64] [--repeats 3]

Each server is started as a run starts it (`python -m realhf.launch_server`, and
`.venv-vllm/bin/python -m realhf.launch_vllm_server`), both fp32, one at a time on a quiet
machine, and sent one /generate of `rows` prompts (random ids of 16..48 tokens), `--new-tokens`
each at T = 1 with EOS ignored, so both generate the same tokens; tokens/s of the best of
`--repeats` (each server warmed up first). `--vllm-env` adds an environment setting to the vLLM
server (e.g. LD_PRELOAD=/path/libtcmalloc.so.4), as vLLM's CPU
documentation recommends; `--native-threads` the built-in server's torch threads (1, as a run
starts it); `--cpu-threads-bind` sets gen_server.vllm.cpu_threads_bind (vLLM's
VLLM_CPU_OMP_THREADS_BIND: 'auto', 'nobind' or a core list such as '0-1'). Models: `tiny` (assets/tiny-math/sft, 0.56M parameters) and `smollm2`
(assets/smollm2-135m-instruct, from scripts/convert_gguf.py; skipped, saying so, where missing).
Measures and prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List

from scripts.bench.common import PYTHON, REPO, emit, log, machine_info, print_tables

MODELS = {
    "tiny": os.path.join(REPO, "assets", "tiny-math", "sft"),
    "smollm2": os.path.join(REPO, "assets", "smollm2-135m-instruct"),
}


def _server(kind: str, model: str, context: int, log_path: str, vllm_env: Dict[str, str], bind: str, threads: int):
    from realhf.api.cli_args import VLLMConfig
    from realhf.base.network import find_free_port
    from realhf.impl.inference.server_process import ServerProcess
    from realhf.impl.inference.vllm_launcher import DEFAULT_PYTHON, build_vllm_command, server_env

    port = find_free_port("127.0.0.1")
    if kind == "native":
        cmd = [PYTHON, "-m", "realhf.launch_server", "--model-path", model, "--port", str(port)]
        cmd += ["--context-length", str(context), "--max-running-requests", "64", "--skip-tokenizer-init"]
        cmd += ["--n-threads", str(threads)]
        env = None
    else:
        cfg = VLLMConfig(context_length=context, max_num_seqs=64, kv_cache_gib=1.0, cpu_threads_bind=bind)
        cmd = build_vllm_command(DEFAULT_PYTHON, model, "127.0.0.1", port, cfg) + ["--skip-tokenizer-init"]
        env = server_env(vllm_env)
    return ServerProcess(cmd, f"http://127.0.0.1:{port}", log_path, startup_timeout=600, env=env)


def _generate(url: str, prompts: List[List[int]], new_tokens: int) -> float:
    body = {
        "input_ids": prompts,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True},
    }
    req = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        out = json.loads(resp.read())
    seconds = time.perf_counter() - t0
    got = sum(len(o["output_ids"]) for o in out)
    if got != len(prompts) * new_tokens:
        raise RuntimeError(f"{url}: {got} tokens generated, asked for {len(prompts) * new_tokens}")
    return seconds


def _vocab(model: str) -> int:
    with open(os.path.join(model, "config.json")) as f:
        return int(json.load(f)["vocab_size"])


def measure(kind, model, rows_list, new_tokens, repeats, vllm_env, bind, threads, tmp) -> Dict[int, float]:
    """tokens/s by rows, the best of `repeats`, one server started once."""
    vocab, rng = _vocab(model), random.Random(0)
    server = _server(kind, model, 48 + new_tokens + 8, os.path.join(tmp, f"{kind}.log"), vllm_env, bind, threads)
    t0 = time.monotonic()
    server.start()
    log(f"{kind} server on {os.path.basename(model)} ready in {time.monotonic() - t0:.1f}s")
    try:
        out = {}
        for rows in rows_list:
            prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(16, 48))] for _ in range(rows)]
            _generate(server.url, prompts, 4)  # warm-up
            best = min(_generate(server.url, prompts, new_tokens) for _ in range(repeats))
            out[rows] = rows * new_tokens / best
            log(f"{kind} {os.path.basename(model)} rows={rows}: {out[rows]:.0f} tokens/s (best of {repeats})")
        return out
    finally:
        server.stop()


def tables(result: Dict[str, Any]):
    rows = []
    for model, by in result["models"].items():
        if "skipped" in by:
            rows.append((model, "-", "-", "-", by["skipped"]))
            continue
        for r in result["rows"]:
            n, v = by.get("native", {}).get(str(r)), by.get("vllm", {}).get(str(r))
            ratio = f"{v / n:.2f}" if n and v else "-"
            rows.append((model, r, f"{n:.0f}" if n else "-", f"{v:.0f}" if v else "-", ratio))
    return [
        (
            f"Built-in engine vs vLLM-CPU behind realhf's server ({result['new_tokens']} new tokens a row, T=1, fp32)",
            ("model", "rows", "built-in tokens/s", "vLLM tokens/s", "vLLM / built-in"),
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.vllm_engine", description=__doc__.split("\n")[0])
    p.add_argument("--short", action="store_true", help="the tiny model, 8 rows, 32 new tokens, 1 repeat")
    p.add_argument("--models", default="tiny,smollm2")
    p.add_argument("--rows", default="8,64")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vllm-env", action="append", default=[], help="KEY=VALUE for the vLLM server (repeatable)")
    p.add_argument("--cpu-threads-bind", default="auto", help="gen_server.vllm.cpu_threads_bind of the vLLM server")
    p.add_argument("--native-threads", type=int, default=1, help="torch threads of the built-in server")
    p.add_argument("--engines", default="native,vllm", help="which servers to measure")
    args = p.parse_args(argv)
    if args.short:
        args.models, args.rows, args.new_tokens, args.repeats = "tiny", "8", 32, 1
    rows_list = [int(r) for r in args.rows.split(",")]
    vllm_env = dict(kv.split("=", 1) for kv in args.vllm_env)
    result: Dict[str, Any] = {
        "bench": "vllm_engine",
        "machine": machine_info(),
        "rows": rows_list,
        "new_tokens": args.new_tokens,
        "vllm_env": vllm_env,
        "cpu_threads_bind": args.cpu_threads_bind,
        "native_threads": args.native_threads,
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="realhf-bench-vllm-") as tmp:
        for name in args.models.split(","):
            model = MODELS[name]
            if not os.path.isfile(os.path.join(model, "config.json")):
                result["models"][name] = {"skipped": f"{model} is missing (scripts/convert_gguf.py makes it)"}
                continue
            result["models"][name] = {
                kind: {
                    str(k): v
                    for k, v in measure(
                        kind,
                        model,
                        rows_list,
                        args.new_tokens,
                        args.repeats,
                        vllm_env,
                        args.cpu_threads_bind,
                        args.native_threads,
                        tmp,
                    ).items()
                }
                for kind in args.engines.split(",")
            }
    print_tables(tables(result))
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
