"""A real GenerationServer worker process whose engine's decode steps block forever.

    python hung_server_worker.py '<json: experiment, trial, redis_url, model_path, ...>'

Its engine thread stays alive and its HTTP server answers /health, as a server stuck in a CUDA
call or a deadlock would; only the worker's own liveness check can tell. Exits with the worker's
exit code."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/: the helpers package

from helpers.native_server import make_decode_hang  # noqa: E402
from realhf.api.cli_args import NameResolveConfig, NativeEngineConfig  # noqa: E402
from realhf.api.worker_configs import GenerationServerConfig  # noqa: E402
from realhf.system.gen_server.generation_server import GenerationServer  # noqa: E402
from realhf.system.worker_base import WorkerContext  # noqa: E402


class HungGenerationServer(GenerationServer):
    def _configure(self) -> None:
        super()._configure()
        make_decode_hang(self._engine, on_hang=lambda: self.logger.warning("decode step hangs (test hook)"))


def main() -> int:
    a = json.loads(sys.argv[1])
    ctx = WorkerContext(
        experiment_name=a["experiment"],
        trial_name=a["trial"],
        worker_type="generation_server",
        name_resolve=NameResolveConfig(type="redis", redis_url=a["redis_url"], keepalive_ttl=5.0),
    )
    config = GenerationServerConfig(
        model_path=a["model_path"],
        host="127.0.0.1",
        device="cpu",
        native=NativeEngineConfig(max_running_requests=a["slots"], context_length=a["context"]),
        health_check_interval=a["health_check_interval"],
        health_timeout=a["health_timeout"],
        max_health_failures=a["max_health_failures"],
        keepalive_ttl=5.0,
    )
    return HungGenerationServer(ctx, config).run()


if __name__ == "__main__":
    sys.exit(main())
