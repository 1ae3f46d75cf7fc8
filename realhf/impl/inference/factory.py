"""An engine for a model directory: which runner serves it, with which settings.

    create_engine(model_path, ...)                  keyword settings (tests, benchmarks)
    create_engine_from_config(model_path, config)   a `NativeEngineConfig` (servers)

`kind='auto'` picks the fast static-KV runner for the Qwen2/Llama family and the HF-forward
runner for any other causal LM. `device` (a `realhf.base.device.pick_device` result, the CPU
when not given) is where the runner puts its weights and cache and the engine its per-step
tensors. The engine comes back unstarted: call `.start()`.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from realhf.api.choices import NATIVE_ENGINE_KINDS
from realhf.base import logging
from realhf.base.device import pick_device
from realhf.impl.inference.engine import Engine
from realhf.impl.inference.hf_runner import HFRunner
from realhf.impl.inference.runners import ModelRunner, StaticKVRunner
from realhf.impl.inference.transformer import SUPPORTED_MODEL_TYPES, read_hf_config

logger = logging.getLogger("engine")


def engine_kind_for(model_path: str, kind: str = "auto") -> str:
    """The runner kind for a model directory: `kind` itself unless 'auto'."""
    if kind not in NATIVE_ENGINE_KINDS:
        raise ValueError(f"engine kind must be 'auto', 'static_kv' or 'hf', got {kind!r}")
    if kind != "auto":
        return kind
    return "static_kv" if read_hf_config(model_path).get("model_type") in SUPPORTED_MODEL_TYPES else "hf"


def create_engine(
    model_path: str,
    *,
    kind: str = "auto",
    max_running_requests: int = 256,
    context_length: int = 0,
    dtype: str = "float32",
    n_threads: int = 1,
    seed: int = 1,
    weight_version: int = 0,
    name: str = "engine",
    attention: str = "auto",
    device: Optional[torch.device] = None,
    keep_running_on_update: bool = False,
) -> Engine:
    """An (unstarted) engine for an HF model directory on `device` (default: the CPU): the
    static-KV runner for Qwen2/Llama, the HF-forward fallback for anything else (kind='auto').
    `attention` picks the static-KV runner's decode attention: 'auto' (the C kernel if it builds
    here and the device is the CPU), 'kernel' or 'torch'."""
    device = device or pick_device("cpu")
    torch.set_num_threads(n_threads)
    kind = engine_kind_for(model_path, kind)
    t0 = time.monotonic()
    runner: ModelRunner
    if kind == "static_kv":
        runner = StaticKVRunner(model_path, max_running_requests, context_length, dtype, attention, device)
    else:
        runner = HFRunner(model_path, max_running_requests, context_length, dtype, device)
    logger.info(
        f"{name}: {kind} runner for {model_path} ({time.monotonic() - t0:.1f}s) on {device}: "
        f"{runner.n_slots} slots x {runner.context_len} tokens, vocab {runner.vocab_size}, "
        f"{dtype}, {n_threads} thread(s), decode attention {getattr(runner, 'attention', 'hf forward')}, "
        f"weight version {weight_version}"
    )
    return Engine(
        runner,
        weight_version=weight_version,
        seed=seed,
        n_threads=n_threads,
        model_path=model_path,
        name=name,
        keep_running_on_update=keep_running_on_update,
    )


def create_engine_from_config(
    model_path: str,
    config,
    *,
    weight_version: int = 0,
    seed: Optional[int] = None,
    name: str = "engine",
    device: Optional[torch.device] = None,
) -> Engine:
    """`create_engine` from a `NativeEngineConfig`, on `device` (the server picks it)."""
    return create_engine(
        model_path,
        kind=config.kind,
        max_running_requests=config.max_running_requests,
        context_length=config.context_length,
        dtype=config.dtype,
        n_threads=config.n_threads,
        seed=config.seed if seed is None else seed,
        weight_version=weight_version,
        name=name,
        attention=config.decode_attention,
        device=device,
        keep_running_on_update=config.keep_running_on_update,
    )
