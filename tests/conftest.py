"""Shared pytest set-up: the `slow` marker and the helpers package on the path."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --runslow to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


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
def no_leftover_processes():
    """Fails the test if it leaves any child process of the test runner behind."""
    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline_left = [p for p in me.children(recursive=True) if p.pid not in before]
    gone, alive = psutil.wait_procs(deadline_left, timeout=5)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    for p in alive:
        p.kill()
    assert not alive, f"processes left behind: {[(p.pid, p.cmdline()) for p in alive]}"
