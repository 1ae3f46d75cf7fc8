"""The `sglang` backend: the `python -m sglang.launch_server` command line.

sglang itself is never imported here (it is a GPU-cluster dependency, absent in CI); the child
process imports it. `build_sglang_command` is a pure function of the config; the process is a
`realhf.impl.inference.server_process.ServerProcess`.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import List

from realhf.api.cli_args import SGLangConfig


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def build_sglang_command(
    model_path: str,
    host: str,
    port: int,
    config: SGLangConfig,
    *,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    gpu_share: float = 1.0,
    seed: int = 1,
    python: str = sys.executable,
    api_key_file: str = "",
) -> List[str]:
    """The `python -m sglang.launch_server ...` argv. Optional SGLang fields are passed only when
    set away from their "SGLang's default" value, so SGLang keeps choosing them itself. With
    `api_key_file` (the run's secret, in an owner-only file) the server requires the key, handed
    over by `realhf.impl.inference.sglang_entry` so that it is on no command line. `gpu_share`
    is the server's part of GPUs it shares with a trainer rank (realhf.base.placement):
    `config.mem_fraction_static` is a fraction of a whole GPU, so SGLang gets that much of its
    share, and its activations stay inside the share too."""
    if not model_path:
        raise ValueError("sglang backend: model_path is empty")
    if tp_size < 1:
        raise ValueError(f"sglang backend: tp_size must be >= 1, got {tp_size}")
    if base_gpu_id < 0:
        raise ValueError(f"sglang backend: base_gpu_id must be >= 0, got {base_gpu_id}")
    if not 0 < gpu_share <= 1:
        raise ValueError(f"sglang backend: gpu_share must lie in (0, 1], got {gpu_share}")
    entry = (
        ["realhf.impl.inference.sglang_entry", "--api-key-file", api_key_file]
        if api_key_file
        else ["sglang.launch_server"]
    )
    cmd = [
        python,
        "-m",
        *entry,
        "--model-path",
        model_path,
        "--skip-tokenizer-init",
        "--tp-size",
        str(tp_size),
        "--base-gpu-id",
        str(base_gpu_id),
        "--random-seed",
        str(seed),
        "--host",
        host,
        "--port",
        str(port),
        "--mem-fraction-static",
        f"{config.mem_fraction_static * gpu_share:.6g}",
        "--dtype",
        config.dtype,
        "--kv-cache-dtype",
        config.kv_cache_dtype,
        "--log-level",
        config.log_level,
    ]
    if config.context_length > 0:
        cmd += ["--context-length", str(config.context_length)]
    if config.max_running_requests > 0:
        cmd += ["--max-running-requests", str(config.max_running_requests)]
    if config.chunked_prefill_size != -1:
        cmd += ["--chunked-prefill-size", str(config.chunked_prefill_size)]
    if config.attention_backend:
        cmd += ["--attention-backend", config.attention_backend]
    if config.enable_metrics:
        cmd.append("--enable-metrics")
    if config.disable_radix_cache:
        cmd.append("--disable-radix-cache")
    cmd += [str(a) for a in config.extra_args]
    return cmd
