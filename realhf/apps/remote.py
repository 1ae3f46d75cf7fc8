"""Process entry point of every worker: `python -m realhf.apps.remote worker --config PATH`.

The launcher writes one YAML file per worker: `worker_class` (a built-in worker type or a
`module:Class` path), its `WorkerContext` under `context` (with the launch directory and the
user_paths that the user's code is imported from), and its config under `config`.
"""

import argparse
import os

from omegaconf import OmegaConf

from realhf.base import logging
from realhf.base.importing import use_import_roots
from realhf.base.process_exit import run_then_exit
from realhf.experiments.worker_validation import validate_worker_config
from realhf.system import worker_class
from realhf.system.worker_base import WorkerContext


def load_worker(config_path: str):
    raw = OmegaConf.load(config_path)
    ctx = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkerContext), raw.context))
    # Before anything of the user's is imported (a worker class, or its config's checks).
    use_import_roots(ctx.launch_dir or os.getcwd(), ctx.user_paths)
    cls = worker_class(raw.get("worker_class") or ctx.worker_type)
    config = None
    if cls.config_cls is not None:
        config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls.config_cls), raw.get("config") or {}))
        validate_worker_config(config)  # the rules the entry point applied, held again at this entry
    return cls(ctx, config)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realhf.apps.remote")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker", help="run one worker process")
    w.add_argument("--config", required=True, help="YAML with the worker's context and config")
    args = parser.parse_args(argv)
    raw = OmegaConf.load(args.config)
    logging.setup(prefix=f"[{raw.context.worker_type}/{raw.context.worker_index}]")
    worker = load_worker(args.config)
    return worker.run()


if __name__ == "__main__":
    run_then_exit(main)  # not sys.exit: realhf.base.process_exit says why
