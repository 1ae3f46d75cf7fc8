"""`unit` stage: the trainer's and the engine's numerics on the device against the CPU.

    python -m scripts.gpu_check unit [--device cuda|cpu] [--out DIR]

Checks, each recorded with its numbers in DIR/unit.json:
    process_group     the device's backend (NCCL on a GPU, gloo on the CPU): a one-rank group,
                      an all-reduce, realhf.base.device.all_reduce_sum of a CPU tensor
    ppo_step_fp32     one PPO step (actor_inf, ref_inf, actor_train; FSDP2-sharded actor and
                      reference, fp32 compute) on the device vs the same step on the CPU
    ppo_step_bf16     the same step in bf16 mixed precision (the GPU default) vs the CPU in fp32
    ppo_step_critic   GAE with a critic (critic_inf, critic_train, then actor_train), fp32
    engine_logprobs   the native engine's sampled tokens and log-probs on the device vs HF's
                      forward on the same tokens (fp32 and bf16 engines)
    weight_swap       the engine swaps to perturbed weights between steps: new version, greedy
                      answer equal to HF's greedy answer under the new weights
    weights_distributed   weight_sync=distributed: a `python -m realhf.launch_server` process with its
                      engine on the device joins a gloo group through SGLang's HTTP protocol and
                      takes perturbed weights from this process's broadcast: new version, greedy
                      answer equal to HF's under them (gloo: a server sharing the trainer's GPU)

On the CPU (`--device cpu`, the suite) both sides run on the CPU: the numbers then only show the
checks themselves work.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
from typing import Any, Dict

from scripts.gpu_check.checks import (
    TINY_MODEL,
    CheckFailed,
    Stage,
    add_common_args,
    default_device,
    log,
    require,
)

N_PROMPTS = 4  # × 8 answers: a train step of 32 sequences, two minibatches


# ---- the PPO step ------------------------------------------------------------------------------


def _step(
    device: str, batch, *, param_dtype: str, critic: bool, shared_prompt: bool = True, shard: bool = True
) -> Dict[str, Any]:
    """One PPO step on `device` from the tiny model's weights: the updated actor's parameters
    (fp32, on the CPU), their change, and the step's stats."""
    import torch
    import torch.distributed as dist

    from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
    from realhf.api.worker_configs import ModelWorkerConfig
    from realhf.base.device import dist_backend, pick_device
    from realhf.impl.engine.fsdp_engine import FSDPEngine
    from realhf.system.trainer.ppo_actor import PPOActor, PPOCritic, engine_config, reference_logprobs
    from realhf.system.trainer.ppo_step import default_graph

    # eps 1e-6: Adam divides by sqrt(v) + eps, so with 1e-8 float noise in a near-zero gradient
    # moves that weight by ~lr; the CPU and the device would then differ by noise, not by a bug.
    optim = OptimizerConfig(lr=1e-3, eps=1e-6, gradient_clipping=1.0)
    ppo = PPOHyperparameters(
        ppo_n_minibatches=2, kl_ctl=0.1, adv_estimator="gae" if critic else "grpo", shared_prompt=shared_prompt
    )
    cfg = ModelWorkerConfig(
        actor=ModelTrainEvalConfig(path=TINY_MODEL, optimizer=optim, param_dtype=param_dtype),
        # Every engine in the asked dtype: the reference and the critic have settings of their own.
        ref=ModelTrainEvalConfig(param_dtype=param_dtype),
        critic=ModelTrainEvalConfig(optimizer=optim, param_dtype=param_dtype),
        ppo=ppo,
        device=device,
        seed=3,
        total_train_steps=1,
    )
    dev = pick_device(device)
    dist.init_process_group(dist_backend(dev), store=dist.HashStore(), rank=0, world_size=1)
    engines = {}
    try:
        for role in default_graph(ppo).models():
            # shard_single_rank: FSDP2's sharding, all-gathers and reduce-scatters run even at DP=1.
            engines[role] = FSDPEngine(dataclasses.replace(engine_config(cfg, role, 0), shard_single_rank=shard))
            engines[role].initialize()
        before = _params(engines["actor"])
        b = dataclasses.replace(
            batch, prox_logprobs=None, ref_logprobs=None, values=None, advantages=None, returns=None
        )
        actor = PPOActor(engines["actor"], ppo)
        stats = {"actor_inf": actor.compute_logprobs(b)["logprob_mean"]}
        stats["ref_inf"] = reference_logprobs(engines["ref"], b, ppo.gen.temperature)["logprob_mean"]
        if critic:
            pc = PPOCritic(engines["critic"], ppo, actor.kl)
            stats["critic_inf"] = pc.compute_values(b)["value_mean"]
            stats["critic_loss"] = pc.train_step(b).get("value_loss", float("nan"))
        train = actor.train_step(b)
        stats.update({k: float(v) for k, v in train.items() if isinstance(v, (int, float))})
        after = _params(engines["actor"])
        if dev.type == "cuda":
            stats["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated(dev) / 2**20, 1)
        logprobs = {"prox": b.prox_logprobs.detach().float().cpu(), "ref": b.ref_logprobs.detach().float().cpu()}
        return {
            "params": after,
            "delta": after - before,
            "stats": stats,
            "logprobs": logprobs,
            "mask": b.loss_mask.cpu(),
        }
    finally:
        for engine in engines.values():
            engine.destroy()
        if dist.is_initialized():
            dist.destroy_process_group()


def _params(engine):
    import torch

    out = []
    for p in engine.model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(t.detach().float().cpu().flatten())
    return torch.cat(out)


def _compare_steps(
    ref: Dict[str, Any], got: Dict[str, Any], *, min_cosine: float, max_rel: float | None
) -> Dict[str, Any]:
    import torch

    d_ref, d_got = ref["delta"], got["delta"]
    cosine = float(torch.nn.functional.cosine_similarity(d_ref, d_got, dim=0))
    rel = float((d_got - d_ref).abs().max() / d_ref.abs().max().clamp_min(1e-12))
    shared = sorted(set(ref["stats"]) & set(got["stats"]))
    stat_diff = {k: abs(got["stats"][k] - ref["stats"][k]) for k in shared if k != "peak_gpu_mib"}
    # The forwards before any update: where the device and the CPU part, if they do.
    mask = ref["mask"]
    logprob_diff = {
        f"{k}_logprob_max_abs_diff": float(f"{float((got['logprobs'][k] - ref['logprobs'][k])[mask].abs().max()):.3g}")
        for k in ("prox", "ref")
    }
    out = {
        "update_cosine": round(cosine, 6),
        "update_max_rel_diff": float(f"{rel:.3g}"),
        "param_max_abs_diff": float(f"{float((got['params'] - ref['params']).abs().max()):.3g}"),
        "update_max_abs": float(f"{float(d_ref.abs().max()):.3g}"),
        **logprob_diff,
        "stats_max_abs_diff": float(f"{max(stat_diff.values()):.3g}") if stat_diff else 0.0,
        "worst_stat": max(stat_diff, key=stat_diff.get) if stat_diff else "",
        "stats_cpu_vs_device": {
            k: [float(f"{ref['stats'][k]:.5g}"), float(f"{got['stats'][k]:.5g}")]
            for k in ("actor_inf", "ref_inf", "loss", "kl_ref", "grad_norm", "approx_kl", "entropy")
            if k in ref["stats"] and k in got["stats"]
        },
        "peak_gpu_mib": got["stats"].get("peak_gpu_mib"),
    }
    problems = []
    if cosine < min_cosine:
        problems.append(f"update cosine {cosine:.6f} < {min_cosine} (device vs CPU)")
    if max_rel is not None and rel > max_rel:
        problems.append(f"update max relative difference {rel:.3g} > {max_rel} (device vs CPU)")
    if problems:
        raise CheckFailed("; ".join(problems), out)
    return out


# ---- the engine ----------------------------------------------------------------------------------


def _hf_logprobs(model, prompt, output, device):
    import torch

    ids = torch.tensor([prompt + output], device=device)
    with torch.no_grad():
        logits = model(ids).logits.float()[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output, device=device)[:, None])[:, 0].cpu()


def _engine_vs_hf(device: str, dtype: str, max_abs: float) -> Dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from realhf.base.device import pick_device
    from realhf.impl.inference.factory import create_engine
    from realhf.impl.inference.request import GenerateRequest, SamplingParams

    dev = pick_device(device)
    prompts = [[3 + i, 10 + 2 * i, 40 + i] for i in range(8)]
    engine = create_engine(TINY_MODEL, dtype=dtype, max_running_requests=8, context_length=128, device=dev).start()
    try:
        futures = [
            engine.submit(GenerateRequest(p, SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)))
            for p in prompts
        ]
        results = [f.result(120) for f in futures]
    finally:
        engine.stop()
    hf = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32).to(dev).eval()
    worst = 0.0
    for p, r in zip(prompts, results):
        require(len(r.output_ids) == 24, f"engine answered {len(r.output_ids)} tokens, asked for 24")
        ref = _hf_logprobs(hf, p, r.output_ids, dev)
        worst = max(worst, float((torch.tensor(r.output_logprobs) - ref).abs().max()))
    require(worst <= max_abs, f"engine log-probs differ from HF's fp32 forward by {worst:.3g} > {max_abs} ({dtype})")
    return {"dtype": dtype, "max_abs_logprob_diff": float(f"{worst:.3g}"), "tokens": 8 * 24}


def _weight_swap(device: str) -> Dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from realhf.base.device import pick_device
    from realhf.impl.inference.factory import create_engine
    from realhf.impl.inference.request import GenerateRequest, SamplingParams

    dev = pick_device(device)
    tmp = tempfile.mkdtemp(prefix="realhf-gpu-check-")
    try:
        model_b = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in model_b.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        path_b = os.path.join(tmp, "b")
        model_b.save_pretrained(path_b)
        for name in os.listdir(TINY_MODEL):
            if name.startswith("tokenizer") or name == "generation_config.json":
                shutil.copy(os.path.join(TINY_MODEL, name), path_b)
        engine = create_engine(TINY_MODEL, max_running_requests=4, context_length=128, device=dev).start()
        try:
            version = engine.update_weights(path_b, 7)
            r = engine.submit(
                GenerateRequest([3, 4], SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True))
            ).result(60)
        finally:
            engine.stop()
        model_b = model_b.to(dev).eval()
        with torch.no_grad():
            ref = model_b.generate(
                torch.tensor([[3, 4]], device=dev), max_new_tokens=12, do_sample=False, min_new_tokens=12
            )[0, 2:].tolist()
        require(
            version == 7 and r.weight_version == 7,
            f"weight version after the swap: {version}/{r.weight_version}, want 7",
        )
        require(r.output_ids == ref, f"greedy answer after the swap {r.output_ids} != HF's under the new weights {ref}")
        return {"weight_version": version, "greedy_tokens_equal": 12}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _process_group(device: str) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    from realhf.base.device import all_reduce_sum, bind_device, dist_backend, pick_device

    dev = pick_device(device)
    bind_device(dev)
    backend = dist_backend(dev)
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.arange(4, dtype=torch.float32, device=dev)
        dist.all_reduce(t)
        summed = all_reduce_sum(torch.tensor([1.0, 2.0]))  # a CPU tensor through the device's backend
        require(
            t.tolist() == [0.0, 1.0, 2.0, 3.0] and summed.tolist() == [1.0, 2.0],
            "all-reduce over one rank changed values",
        )
        return {"backend": backend}
    finally:
        dist.destroy_process_group()


def _weights_distributed(device: str) -> Dict[str, Any]:
    import json
    import re
    import subprocess
    import sys
    import time
    import urllib.request

    import torch
    from transformers import AutoModelForCausalLM

    from realhf.base.device import pick_device
    from realhf.system.trainer.weight_broadcast import WeightBroadcaster

    dev = pick_device(device)
    log_path = os.path.join(tempfile.mkdtemp(prefix="realhf-gpu-check-"), "server.log")
    with open(log_path, "wb") as out:
        args = ["--model-path", TINY_MODEL, "--device", device, "--port", "0", "--context-length", "128"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "realhf.launch_server", *args], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None:
            m = re.search(r"ready at (http://[\d.]+:\d+)", open(log_path).read())
            url = m.group(1) if m else None
            require(
                proc.poll() is None and time.monotonic() < deadline,
                f"server did not start: {open(log_path).read()[-2000:]}",
            )
            time.sleep(0.2)

        def call(path, body=None):
            data = None if body is None else json.dumps(body).encode()
            req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
            return json.loads(urllib.request.urlopen(req, timeout=60).read())

        model_b = AutoModelForCausalLM.from_pretrained(TINY_MODEL, dtype=torch.float32)
        gen = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in model_b.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)
        model_b = model_b.to(dev).eval()
        b = WeightBroadcaster(lambda: [url], "127.0.0.1", "gloo", 60.0, 1 << 20)
        try:
            r = b.publish(9, model_b.state_dict().items())
        finally:
            b.close()
        require(r.ok, f"broadcast failed: {r.failed}")
        info = call("/get_model_info")
        out = call(
            "/generate",
            {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}},
        )
        with torch.no_grad():
            ref = model_b.generate(
                torch.tensor([[3, 4]], device=dev), max_new_tokens=12, do_sample=False, min_new_tokens=12
            )[0, 2:].tolist()
        require(info["weight_version"] == "9", f"served weight_version {info['weight_version']!r}, want '9'")
        require(
            out["output_ids"] == ref, f"greedy answer {out['output_ids']} != HF's {ref} under the broadcast weights"
        )
        return {
            "weight_version": 9,
            "seconds": round(r.seconds, 3),
            "bytes": r.n_bytes,
            "greedy_tokens_equal": len(ref),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check unit", description=__doc__.split("\n")[0])
    add_common_args(p)
    args = p.parse_args(argv)
    device = args.device or default_device()

    import torch

    from scripts.bench.trainer import sample_batch

    torch.set_num_threads(min(4, os.cpu_count() or 1))
    stage = Stage("unit", args.out, device)
    log(f"device {device}; torch {torch.__version__}; sampling a batch of {N_PROMPTS} x 8 answers on the CPU")
    batch = sample_batch(N_PROMPTS)
    stage.run("process_group", lambda: _process_group(device))

    cpu_fp32 = {}

    def step(name, dtype, critic, min_cosine, max_rel, **variant):
        def run():
            key = ("critic" if critic else "actor", tuple(sorted(variant.items())))
            # The device's step first: where the device is missing it fails at once, before the
            # CPU reference has been computed for nothing.
            got = _step(device, batch, param_dtype=dtype, critic=critic, **variant)
            if key not in cpu_fp32:
                cpu_fp32[key] = _step("cpu", batch, param_dtype="float32", critic=critic, **variant)
            return {
                "dtype": dtype,
                **variant,
                **_compare_steps(cpu_fp32[key], got, min_cosine=min_cosine, max_rel=max_rel),
            }

        stage.run(name, run)

    step("ppo_step_fp32", "float32", False, 0.9999, 1e-2)
    # The same step one piece at a time: a plain forward per row, and no FSDP2 wrapping at DP=1.
    step("ppo_step_fp32_plain_forward", "float32", False, 0.9999, 1e-2, shared_prompt=False)
    step("ppo_step_fp32_unsharded", "float32", False, 0.9999, 1e-2, shard=False)
    # bf16 compute: gradients differ by bf16 rounding, which flips Adam's near-sign update of
    # weights with tiny gradients (no bound on the largest difference), but not its direction.
    step("ppo_step_bf16", "bfloat16", False, 0.9, None)
    step("ppo_step_critic", "float32", True, 0.9999, 1e-2)
    stage.run("engine_logprobs_fp32", lambda: _engine_vs_hf(device, "float32", 1e-3))
    stage.run("engine_logprobs_bf16", lambda: _engine_vs_hf(device, "bfloat16", 0.25))
    stage.run("weight_swap", lambda: _weight_swap(device))

    stage.run("weights_distributed", lambda: _weights_distributed(device))
    return stage.finish()
