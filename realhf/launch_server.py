"""The native engine as a standalone SGLang-protocol server, like `python -m sglang.launch_server`.

    python -m realhf.launch_server --model-path DIR --host 127.0.0.1 --port 30000 \\
        [--n-threads 1 --max-running-requests 256 --context-length 0 --dtype float32 \\
         --kind auto --seed 1 --weight-version 0]

`--port 0` picks a free port; the line `realhf.launch_server ready at http://HOST:PORT` on stderr
says which. A few SGLang flags are accepted for drop-in use (`--skip-tokenizer-init` is implied;
`--random-seed` = `--seed`; `--tp-size` must be 1). SIGINT/SIGTERM stop it cleanly.
"""

import argparse
import signal
import sys

from realhf.base import logging


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m realhf.launch_server", description=__doc__.split("\n")[0])
    p.add_argument("--model-path", required=True, help="HF model directory (config.json + safetensors)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0: a free port")
    p.add_argument("--n-threads", type=int, default=1, help="torch threads")
    p.add_argument("--max-running-requests", type=int, default=256, help="KV-cache slots")
    p.add_argument("--context-length", type=int, default=0, help="tokens per slot; 0: the model's maximum")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--kind", default="auto", choices=["auto", "static_kv", "hf"])
    p.add_argument("--seed", "--random-seed", dest="seed", type=int, default=1)
    p.add_argument("--weight-version", type=int, default=0)
    p.add_argument("--served-model-name", default="")
    p.add_argument("--log-level", default="info")
    p.add_argument("--skip-tokenizer-init", action="store_true", help="accepted for SGLang compatibility (always on)")
    p.add_argument("--tp-size", type=int, default=1, help="accepted for SGLang compatibility; must be 1")
    args = p.parse_args(argv)
    if args.tp_size != 1:
        p.error(f"--tp-size must be 1 for the native CPU engine, got {args.tp_size}")
    for name in ("n_threads", "max_running_requests"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.setup(level=args.log_level.upper(), prefix="[launch_server]")
    logger = logging.getLogger("launch_server")

    import uvicorn

    from realhf.impl.inference.engine import create_engine
    from realhf.impl.inference.server_app import create_app
    from realhf.system.http_thread import listening_socket

    engine = create_engine(args.model_path, kind=args.kind, max_running_requests=args.max_running_requests,
                           context_length=args.context_length, dtype=args.dtype, n_threads=args.n_threads,
                           seed=args.seed, weight_version=args.weight_version, name="engine")
    sock = listening_socket(args.host, args.port, "realhf.launch_server")
    try:
        port = sock.getsockname()[1]
        engine.start()
        app = create_app(engine, args.served_model_name)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        logger.info(f"realhf.launch_server ready at http://{args.host}:{port}")
        # uvicorn handles SIGINT/SIGTERM while serving, then re-raises the signal to the handler
        # installed before it: a no-op here, so that the clean-up below still runs.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
