"""Fixtures of the inference tests: tiny models, their HF references, a live native server.

The conformance tests talk to the server only through the SGLang HTTP protocol, so they can be
pointed at any server: set REALHF_CONFORMANCE_URL (e.g. a real `python -m sglang.launch_server
--skip-tokenizer-init` on a GPU box) and REALHF_CONFORMANCE_MODEL (the model directory it serves)
and the same assertions run against it.
"""

import os

import pytest

from helpers.tiny_models import make_random_causal_lm
from inference_helpers import CONTEXT, SLOTS, HFReference


@pytest.fixture(scope="session")
def qwen_path(tmp_path_factory):
    return make_random_causal_lm(str(tmp_path_factory.mktemp("qwen_a")), "qwen2", seed=0,
                                 max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def qwen_path_b(tmp_path_factory):
    """Same architecture, other weights: the target of weight swaps."""
    return make_random_causal_lm(str(tmp_path_factory.mktemp("qwen_b")), "qwen2", seed=1,
                                 max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def gpt2_path(tmp_path_factory):
    return make_random_causal_lm(str(tmp_path_factory.mktemp("gpt2")), "gpt2", seed=0)


@pytest.fixture(scope="session")
def hf_ref(qwen_path):
    return HFReference(os.environ.get("REALHF_CONFORMANCE_MODEL") or qwen_path)


@pytest.fixture(scope="session")
def hf_ref_b(qwen_path_b):
    return HFReference(qwen_path_b)


@pytest.fixture(scope="module")
def server_url(qwen_path):
    """A native server (engine thread + uvicorn on 127.0.0.1) for a test module, or an external one."""
    external = os.environ.get("REALHF_CONFORMANCE_URL")
    if external:
        yield external.rstrip("/")
        return
    from realhf.impl.inference.factory import create_engine
    from realhf.impl.inference.server_app import create_app
    from realhf.system.http_thread import HttpServerThread

    engine = create_engine(qwen_path, max_running_requests=SLOTS, context_length=CONTEXT, seed=1).start()
    server = HttpServerThread(create_app(engine), "127.0.0.1", 0, name="generation-server")
    try:
        server.start(timeout=30)
        yield server.url
    finally:
        engine.stop()
        server.stop()
