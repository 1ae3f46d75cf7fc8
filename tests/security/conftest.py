"""Live servers for the security tests: the native generation server and the GserverManager,
each served for real by uvicorn on 127.0.0.1, plus a tiny HF model for the native engine."""

import pytest

from helpers.tiny_models import make_random_causal_lm

CONTEXT = 64  # small: fuzzed /generate bodies that fit finish in a few decode steps
SLOTS = 8


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    return make_random_causal_lm(str(tmp_path_factory.mktemp("tiny_qwen")), "qwen2", seed=0,
                                 max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def native_server(tiny_model_path):
    """(url, engine) of a native generation server."""
    from realhf.impl.inference.factory import create_engine
    from realhf.impl.inference.server_app import create_app
    from realhf.system.http_thread import HttpServerThread

    engine = create_engine(tiny_model_path, max_running_requests=SLOTS, context_length=CONTEXT, seed=1).start()
    server = HttpServerThread(create_app(engine), "127.0.0.1", 0, name="generation-server")
    try:
        server.start(timeout=30)
        yield server.url, engine
    finally:
        server.stop()
        engine.stop()


@pytest.fixture(scope="module")
def manager_server(tmp_path_factory):
    """(url, service) of a GserverManager app routing to one (never contacted) server URL."""
    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.system.gserver_manager import create_app
    from realhf.system.http_thread import HttpServerThread
    from realhf.system.manager_service import ManagerService

    config = GserverManagerConfig(max_concurrent_rollouts=8, groups_per_step=2, max_head_offpolicyness=1,
                                  run_dir=str(tmp_path_factory.mktemp("manager_root")))
    service = ManagerService(config, ["http://127.0.0.1:9"])
    server = HttpServerThread(create_app(service), host="127.0.0.1", name="manager-under-test").start()
    try:
        yield server.url, service
    finally:
        server.stop()
