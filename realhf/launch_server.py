"""The native engine as a standalone SGLang-protocol server, like `python -m sglang.launch_server`.

    python -m realhf.launch_server --model-path DIR --host 127.0.0.1 --port 30000 \\
        [--n-threads 1 --max-running-requests 256 --context-length 0 --dtype float32 \\
         --kind auto --seed 1 --decode-attention auto --[no-]keep-running-on-update --weight-version 0 \\
         --device auto --base-gpu-id 0]

The engine options are the fields of `NativeEngineConfig` (same names, defaults and help; `--help`
lists them). `--device` and `--base-gpu-id` (SGLang's flag: the GPU index on this node) are the
two arguments of `realhf.base.device.pick_device`, as `cluster.device` and
`GenerationServerConfig.base_gpu_id` are in a run. `--port 0` picks a free port; the line
`realhf.launch_server ready at http://HOST:PORT` on stderr says which. `--secret-file PATH`: every
endpoint then requires `Authorization: Bearer <the file's content>` (realhf.base.secret); the
secret itself is never an argument, so it stays out of `ps`. The tokenizer of the model folder
(or `--tokenizer-path`) is loaded when there is one: /generate then takes and answers `text` as
SGLang does. A few SGLang flags are accepted for drop-in use (`--skip-tokenizer-init`: input_ids
only; `--random-seed` = `--seed`; `--tp-size` must be 1).

    python -m realhf.launch_server --model-path assets/tiny-math/sft --port 30000
    curl -s localhost:30000/generate -d '{"text": "1+2=", "sampling_params": {"max_new_tokens": 16}}'

SIGINT/SIGTERM stop it cleanly.
"""

import argparse
import dataclasses
import signal
import sys
import typing
from typing import Any, Dict, Optional, Sequence

from realhf.api.choices import DECODE_ATTENTION, NATIVE_ENGINE_KINDS
from realhf.api.cli_args import NativeEngineConfig
from realhf.base import logging
from realhf.base.body_limit import DEFAULT_MAX_REQUEST_BYTES
from realhf.base.device import DEVICE_NAMES, pick_device
from realhf.base.dtypes import DTYPE_NAMES
from realhf.base.model_source import ModelPathError, resolve_model_path
from realhf.experiments.validation import ConfigError, check_native_engine

# Choice lists of NativeEngineConfig's str fields (the dataclass cannot carry them: see choices.py).
_ENGINE_CHOICES = {"dtype": DTYPE_NAMES, "kind": NATIVE_ENGINE_KINDS, "decode_attention": DECODE_ATTENTION}


def add_dataclass_options(
    parser: argparse.ArgumentParser,
    cls: type,
    choices: Optional[Dict[str, Sequence]] = None,
    aliases: Optional[Dict[str, Sequence[str]]] = None,
    skip: Sequence[str] = (),
) -> None:
    """One `--field-name` option per field of the flat dataclass `cls` (but those in `skip`): its
    type, default and `metadata["help"]`; `choices` and extra spellings (`aliases`) by field name."""
    choices, aliases = choices or {}, aliases or {}
    types = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind = types[f.name]
        if kind not in (int, float, str, bool):
            raise TypeError(f"{cls.__name__}.{f.name}: only int/float/str/bool fields map to options, got {kind}")
        flags = ["--" + f.name.replace("_", "-"), *aliases.get(f.name, ())]
        help_ = f.metadata.get("help", "").replace("%", "%%")  # argparse %-formats help strings
        kw: Dict[str, Any] = dict(dest=f.name, default=f.default, help=f"{help_} (default: %(default)s)")
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        else:
            kw["type"] = kind
            if f.name in choices:
                kw["choices"] = list(choices[f.name])
        parser.add_argument(*flags, **kw)


def dataclass_from_args(cls: type, args: argparse.Namespace):
    """`cls` built from the options `add_dataclass_options(parser, cls)` parsed (skipped fields:
    their defaults)."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)})


def add_server_options(p: argparse.ArgumentParser) -> None:
    """The options every engine's standalone server takes (this one and
    `realhf.launch_vllm_server`): what to serve, where to listen, who may ask."""
    p.add_argument(
        "--model-path", required=True, help="HF model directory (config.json + safetensors) or a hub repo id"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind")
    p.add_argument("--port", type=int, default=30000, help="0: a free port")
    p.add_argument(
        "--weights-root",
        default="",
        help="load new weights (/update_weights_from_disk) only from inside this folder; empty: anywhere",
    )
    p.add_argument("--weight-version", type=int, default=0, help="version reported until the first weight update")
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help="largest request body accepted; a larger one is answered 413 (cluster.max_request_bytes)",
    )
    p.add_argument(
        "--secret-file",
        default="",
        help="file holding the secret every request must send as 'Authorization: Bearer <secret>'; "
        "empty: no authentication",
    )
    p.add_argument("--served-model-name", default="", help="model id of /v1/models; empty: the model path")
    p.add_argument("--log-level", default="info")
    p.add_argument(
        "--tokenizer-path", default="", help="tokenizer folder for text in and out; empty: the model folder's"
    )
    p.add_argument(
        "--skip-tokenizer-init",
        action="store_true",
        help="load no tokenizer: /generate takes input_ids only (SGLang's)",
    )


def read_secret(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """args.secret from --secret-file (empty: no authentication); a bad file is a usage error."""
    args.secret = ""
    if args.secret_file:
        try:
            with open(args.secret_file) as f:
                args.secret = f.read().strip()
        except OSError as e:
            p.error(f"--secret-file {args.secret_file}: {e.strerror}")
        if not args.secret:
            p.error(f"--secret-file {args.secret_file} is empty")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m realhf.launch_server", description=__doc__.split("\n")[0])
    add_server_options(p)
    add_dataclass_options(
        p.add_argument_group("engine (NativeEngineConfig)"),
        NativeEngineConfig,
        choices=_ENGINE_CHOICES,
        aliases={"seed": ["--random-seed"]},
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=DEVICE_NAMES,
        help="where the engine computes (cluster.device): 'auto' is a GPU when torch sees one, else the CPU",
    )
    p.add_argument("--base-gpu-id", type=int, default=0, help="the GPU of this node to use when on a GPU")
    p.add_argument("--tp-size", type=int, default=1, help="accepted for SGLang compatibility; must be 1")
    args = p.parse_args(argv)
    if args.tp_size != 1:
        p.error(f"--tp-size must be 1 for the native engine, got {args.tp_size}")
    read_secret(p, args)
    try:  # a GPU asked for on a machine without one is refused here, named by the flag
        args.engine_device = pick_device(args.device, args.base_gpu_id)
    except ValueError as e:
        p.error(f"--device {args.device} --base-gpu-id {args.base_gpu_id}: {e}")
    try:  # the same rules as gen_server.native in a run's config, named by their flags here
        check_native_engine(dataclass_from_args(NativeEngineConfig, args), prefix="")
    except ConfigError as e:
        field, _, rest = str(e).partition(" ")
        p.error(f"--{field.replace('_', '-')} {rest}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.setup(level=args.log_level.upper(), prefix="[launch_server]")
    logger = logging.getLogger("launch_server")

    from realhf.base.device import bind_device
    from realhf.impl.inference.factory import create_engine_from_config
    from realhf.system.gen_server.sglang_generate import load_tokenizer

    try:  # a hub repo id: its local snapshot (offline without a cached copy: refused before loading)
        args.model_path = resolve_model_path("--model-path", args.model_path)
    except ModelPathError as e:
        print(f"python -m realhf.launch_server: error: {e}", file=sys.stderr)
        return 2
    tokenizer_path = args.tokenizer_path or args.model_path
    tokenizer = None if args.skip_tokenizer_init else load_tokenizer(tokenizer_path)
    if tokenizer is None:
        logger.info(f"no tokenizer loaded from {tokenizer_path}: /generate takes input_ids only")
    engine_config = dataclass_from_args(NativeEngineConfig, args)
    bind_device(args.engine_device)
    engine = create_engine_from_config(
        args.model_path, engine_config, weight_version=args.weight_version, name="engine", device=args.engine_device
    )
    serve(engine, args, tokenizer, tokenizer_path, "realhf.launch_server", logger)
    return 0


def serve(engine, args: argparse.Namespace, tokenizer, tokenizer_path: str, prog: str, logger) -> None:
    """Start `engine`, serve it (server_app) on args.host:args.port until SIGINT/SIGTERM, then stop
    it. The line `<prog> ready at http://HOST:PORT` says where (--port 0 picks a free port)."""
    import uvicorn

    from realhf.system.gen_server.server_app import create_app
    from realhf.system.streams.http_thread import listening_socket

    sock = listening_socket(args.host, args.port, prog)
    try:
        port = sock.getsockname()[1]
        engine.start()
        app = create_app(
            engine,
            args.served_model_name,
            max_request_bytes=args.max_request_bytes,
            secret=args.secret,
            weights_root=args.weights_root,
            tokenizer=tokenizer,
            tokenizer_path=tokenizer_path,
        )
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5)
        server = uvicorn.Server(config)
        logger.info(f"{prog} ready at http://{args.host}:{port}")
        # uvicorn handles SIGINT/SIGTERM while serving, then re-raises the signal to the handler
        # installed before it: a no-op here, so that the clean-up below still runs.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        server.run(sockets=[sock])
    finally:
        engine.stop()
        sock.close()
    logger.info("stopped")


if __name__ == "__main__":
    sys.exit(main())
