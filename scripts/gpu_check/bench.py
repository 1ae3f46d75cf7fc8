"""`bench` stage: what realhf's pieces do at realistic shapes on the device.

    python -m scripts.gpu_check bench [--device cuda|cpu] [--out DIR] [--short]

    engine     the native engine's decode tokens/s against HF `generate` (its default dynamic
               cache, sampling at T=1) on the same prompts, random-weight Qwen2 models of about
               0.5B and 1.5B parameters in bf16, B requests at once (B = 64, 256), 128 prompt +
               128 answer tokens, EOS ignored so every row runs to the end (`--shapes` picks the
               shapes; `--hf-model PATH` adds a real model folder, e.g. the SmolLM2-135M example's)
    trainer    one PPO train step (actor_inf + actor_train, GRPO, FSDP2 at DP=1, bf16 compute,
               fp32 master weights and Adam) on the 0.5B model: tokens/s and peak memory

`--short` (the CPU smoke the suite can afford): a tiny random model, B = 4, 8 + 8 tokens.
Results in DIR/bench.json; docs/gpu.md keeps the numbers measured on a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any, Dict

from scripts.gpu_check.checks import Stage, add_common_args, default_device, log

# Qwen2-0.5B's and Qwen2-1.5B's shapes (public config.json files), random weights.
SHAPES = {
    "qwen2-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "qwen2-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
}
TINY = {
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=258,
    )
}


def make_model(root: str, name: str, shape: Dict[str, int], dtype) -> str:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        **shape, max_position_embeddings=4096, tie_word_embeddings=True, dtype=str(dtype).split(".")[-1]
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    path = os.path.join(root, name)
    model.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    log(f"{name}: {n / 1e9:.2f}B parameters written to {path}")
    return path


def _sync(dev):
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def engine_vs_hf(path: str, dev, batch: int, prompt_len: int, new_tokens: int) -> Dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from realhf.impl.inference.factory import create_engine
    from realhf.impl.inference.request import GenerateRequest, SamplingParams

    g = torch.Generator().manual_seed(1)
    engine = create_engine(
        path, dtype="bfloat16", max_running_requests=batch, context_length=prompt_len + new_tokens, device=dev
    ).start()
    try:
        vocab = engine.vocab_size
        prompts = torch.randint(3, min(vocab, 32000), (batch, prompt_len), generator=g).tolist()

        def run_engine(n_rows: int) -> float:
            sp = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
            t0 = time.perf_counter()
            futures = [engine.submit(GenerateRequest(p, sp)) for p in prompts[:n_rows]]
            for f in futures:
                r = f.result(600)
                assert len(r.output_ids) == new_tokens, r.finish_reason
            return time.perf_counter() - t0

        run_engine(min(batch, 8))  # warm-up: kernels, allocator
        engine_s = run_engine(batch)
    finally:
        engine.stop()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    ids = torch.tensor(prompts, device=dev)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    with torch.no_grad():
        model.generate(ids[: min(batch, 8)], **kw)  # warm-up
        _sync(dev)
        t0 = time.perf_counter()
        model.generate(ids, **kw)
        _sync(dev)
        hf_s = time.perf_counter() - t0
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    tokens = batch * new_tokens
    return {
        "batch": batch,
        "engine_tokens_per_s": round(tokens / engine_s, 1),
        "hf_generate_tokens_per_s": round(tokens / hf_s, 1),
        "engine_over_hf": round(hf_s / engine_s, 2),
        "engine_s": round(engine_s, 3),
        "hf_s": round(hf_s, 3),
    }


def trainer_step(
    path: str, device: str, n_prompts: int, group: int, prompt_len: int, answer_len: int, mb_tokens: int
) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
    from realhf.api.trajectory import Sample, Trajectory
    from realhf.api.worker_configs import ModelWorkerConfig
    from realhf.base.device import dist_backend, pick_device
    from realhf.impl.engine.fsdp_engine import FSDPEngine
    from realhf.impl.model.batching import pack_trajectories
    from realhf.system.trainer.ppo_actor import PPOActor, engine_config

    dev = pick_device(device)
    g = torch.Generator().manual_seed(2)
    trajs = []
    for q in range(n_prompts):
        prompt = torch.randint(3, 32000 if device != "cpu" else 250, (prompt_len,), generator=g).tolist()
        samples = []
        for _ in range(group):
            out = torch.randint(3, 32000 if device != "cpu" else 250, (answer_len,), generator=g).tolist()
            samples.append(Sample(out, [-1.0] * answer_len, [0] * answer_len, float(torch.rand((), generator=g) > 0.5)))
        trajs.append(Trajectory(f"q{q}", prompt, samples))
    batch = pack_trajectories(trajs, 0)
    ppo = PPOHyperparameters(ppo_n_minibatches=1, micro_batch_tokens=mb_tokens)
    cfg = ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=path, optimizer=OptimizerConfig(lr=1e-6)),
        ppo=ppo,
        device=device,
        total_train_steps=3,
    )
    dist.init_process_group(dist_backend(dev), store=dist.HashStore(), rank=0, world_size=1)
    engine = FSDPEngine(dataclasses.replace(engine_config(cfg, "actor", 0), shard_single_rank=True))
    try:
        engine.initialize()
        actor = PPOActor(engine, ppo)
        times = []
        for _ in range(3):  # the first is a warm-up
            b = dataclasses.replace(batch, prox_logprobs=None, advantages=None, returns=None)
            _sync(dev)
            t0 = time.perf_counter()
            actor.compute_logprobs(b)
            actor.train_step(b)
            _sync(dev)
            times.append(time.perf_counter() - t0)
        tokens = n_prompts * group * (prompt_len + answer_len)
        out = {
            "sequences": n_prompts * group,
            "tokens": tokens,
            "micro_batch_tokens": mb_tokens,
            "step_s": round(min(times[1:]), 3),
            "tokens_per_s": round(tokens / min(times[1:]), 1),
        }
        if dev.type == "cuda":
            out["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
        return out
    finally:
        engine.destroy()
        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check bench", description=__doc__.split("\n")[0])
    add_common_args(p)
    p.add_argument("--short", action="store_true", help="a tiny model and small batches (the CPU smoke)")
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help=f"random-weight shapes to run, comma-separated, '' for none (default: {','.join(SHAPES)})",
    )
    p.add_argument(
        "--hf-model",
        action="append",
        default=[],
        metavar="PATH",
        help="an HF model folder whose engine tokens/s to measure as well (e.g. assets/smollm2-135m-instruct)",
    )
    args = p.parse_args(argv)
    unknown = [s for s in args.shapes.split(",") if s and s not in SHAPES]
    if unknown:
        p.error(f"--shapes: unknown {unknown}; known: {list(SHAPES)}")
    device = args.device or default_device()

    import torch

    from realhf.base.device import pick_device

    dev = pick_device(device)
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    stage = Stage("bench", args.out, device)
    root = tempfile.mkdtemp(prefix="realhf-gpu-bench-")
    try:
        shapes = TINY if args.short else {k: SHAPES[k] for k in args.shapes.split(",") if k}
        batches = (4,) if args.short else (64, 256)
        prompt_len, new_tokens = (8, 8) if args.short else (128, 128)
        paths = {}
        for name, shape in shapes.items():
            paths[name] = make_model(root, name, shape, torch.bfloat16)
            for b in batches:
                stage.run(
                    f"engine_{name}_b{b}",
                    lambda name=name, b=b: {"model": name, **engine_vs_hf(paths[name], dev, b, prompt_len, new_tokens)},
                )
        for path in args.hf_model:
            name = os.path.basename(os.path.normpath(path))
            for b in batches:
                stage.run(
                    f"engine_{name}_b{b}",
                    lambda path=path, name=name, b=b: {
                        "model": name,
                        **engine_vs_hf(path, dev, b, prompt_len, new_tokens),
                    },
                )
        if not paths:
            return stage.finish()
        first = next(iter(paths))
        if args.short:
            stage.run(
                "trainer_step_tiny", lambda: {"model": first, **trainer_step(paths[first], device, 2, 2, 8, 8, 256)}
            )
        else:
            # 64 sequences of 128 + 384 tokens: a GRPO step of 8 prompts x 8 answers.
            stage.run(
                f"trainer_step_{first}",
                lambda: {"model": first, **trainer_step(paths[first], device, 8, 8, 128, 384, 16384)},
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return stage.finish()
