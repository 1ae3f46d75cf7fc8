"""vLLM behind realhf's SGLang-protocol server: what a `vllm` generation server runs.

    .venv-vllm/bin/python -m realhf.launch_vllm_server --model-path DIR --port 0 \\
        [--dtype float32 --context-length 0 --max-num-seqs 256 --kv-cache-gib 0 --seed 1 ...]

The same HTTP API as the built-in engine's server (`python -m realhf.launch_server`; the options
it shares are the same), with vLLM's AsyncLLM generating (`realhf.impl.inference.vllm_engine`).
The engine options are the fields of `VLLMConfig` (`--help` lists them). It runs from vLLM's own
environment, whose pins (transformers, fastapi) differ from the project's: the generation server
worker starts it with `gen_server.vllm.python` as a child process, as it starts SGLang's.
The line `realhf.launch_vllm_server ready at http://HOST:PORT` on stderr says where it listens.
"""

from __future__ import annotations

import argparse
import os
import sys

from realhf.api.cli_args import VLLMConfig
from realhf.base import logging
from realhf.impl.inference.vllm_launcher import LAUNCHER_FIELDS
from realhf.launch_server import add_dataclass_options, add_server_options, dataclass_from_args, read_secret

PROG = "realhf.launch_vllm_server"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m realhf.launch_vllm_server", description=__doc__.split("\n")[0])
    add_server_options(p)
    add_dataclass_options(p.add_argument_group("engine (VLLMConfig)"), VLLMConfig, skip=LAUNCHER_FIELDS)
    p.add_argument("--seed", type=int, default=1, help="vLLM's sampling seed")
    p.add_argument(
        "--gpu-share", type=float, default=1.0, help="this server's part of a GPU it shares with a trainer rank"
    )
    args = p.parse_args(argv)
    read_secret(p, args)
    if not 0 < args.gpu_share <= 1:
        p.error(f"--gpu-share must lie in (0, 1], got {args.gpu_share}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.setup(level=args.log_level.upper(), prefix=f"[{PROG}]")
    logger = logging.getLogger("vllm_server")
    cfg = dataclass_from_args(VLLMConfig, args)
    # Read by vLLM's CPU platform when its engine starts, so set before.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cfg.cpu_threads_bind

    from realhf.impl.inference.vllm_engine import VLLMEngine
    from realhf.launch_server import serve
    from realhf.system.gen_server.sglang_generate import load_tokenizer

    tokenizer_path = args.tokenizer_path or args.model_path
    tokenizer = None if args.skip_tokenizer_init else load_tokenizer(tokenizer_path)
    engine = VLLMEngine(
        args.model_path, cfg, weight_version=args.weight_version, seed=args.seed, gpu_share=args.gpu_share
    )
    serve(engine, args, tokenizer, tokenizer_path, PROG, logger)
    return 0


if __name__ == "__main__":
    sys.exit(main())
