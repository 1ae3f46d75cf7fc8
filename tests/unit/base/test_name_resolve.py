"""One behavioural suite for both name-resolve backends (memory, and redis on a real server)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.paths import REPO
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve
from realhf.base.name_resolve import NameEntryExistsError, NameEntryNotFoundError


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.system)])
def repo(request):
    if request.param == "memory":
        r = name_resolve.make_repository(NameResolveConfig(type="memory"))
    else:
        url = request.getfixturevalue("redis_url")
        r = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=url))
        r.clear_subtree("nrtest")
    yield r
    r.clear_subtree("nrtest")
    r.close()


@pytest.mark.system
def test_add_then_get_returns_value_as_string(repo):
    repo.add("nrtest/t/a", 42)
    assert repo.get("nrtest/t/a") == "42"


def test_add_existing_key_conflicts_unless_replace(repo):
    repo.add("nrtest/t/a", "1")
    with pytest.raises(NameEntryExistsError, match="nrtest/t/a"):
        repo.add("nrtest/t/a", "2")
    assert repo.get("nrtest/t/a") == "1"
    repo.add("nrtest/t/a", "2", replace=True)
    assert repo.get("nrtest/t/a") == "2"


def test_missing_key_raises_not_found_naming_it(repo):
    with pytest.raises(NameEntryNotFoundError, match="nrtest/t/missing"):
        repo.get("nrtest/t/missing")
    with pytest.raises(NameEntryNotFoundError):
        repo.delete("nrtest/t/missing")


def test_subentries_are_unique_and_listed_under_their_parent(repo):
    subs = {repo.add_subentry("nrtest/t/servers", f"http://h:{i}") for i in range(20)}
    assert len(subs) == 20
    assert repo.find_subtree("nrtest/t/servers") == sorted(subs)
    assert sorted(repo.get_subtree("nrtest/t/servers")) == sorted(f"http://h:{i}" for i in range(20))


def test_prefix_listing_does_not_confuse_a_b_with_a_bc(repo):
    repo.add("nrtest/a/b", "1")
    repo.add("nrtest/a/b/c", "2")
    repo.add("nrtest/a/bc", "3")
    repo.add("nrtest/a/bc/d", "4")
    assert repo.find_subtree("nrtest/a/b") == ["nrtest/a/b", "nrtest/a/b/c"]
    assert repo.find_subtree("nrtest/a/b/") == ["nrtest/a/b", "nrtest/a/b/c"]
    assert repo.get_subtree("nrtest/a/bc") == ["3", "4"]


def test_glob_characters_in_keys_are_literal(repo):
    repo.add("nrtest/g[1]/x", "1")
    repo.add("nrtest/g1/x", "2")
    assert repo.find_subtree("nrtest/g[1]") == ["nrtest/g[1]/x"]


def test_clear_subtree_and_delete(repo):
    for k in ("nrtest/c/x", "nrtest/c/y/z", "nrtest/cd"):
        repo.add(k, "v")
    repo.clear_subtree("nrtest/c")
    assert repo.find_subtree("nrtest/c") == []
    assert repo.get("nrtest/cd") == "v"
    repo.delete("nrtest/cd")
    assert repo.find_subtree("nrtest/cd") == []


def test_wait_returns_once_the_key_appears(repo):
    import threading

    threading.Timer(0.2, lambda: repo.add("nrtest/w/late", "here")).start()
    assert repo.wait("nrtest/w/late", timeout=5) == "here"


def test_wait_timeout_names_the_key_and_the_alive_workers(repo):
    repo.add("nrtest/w/worker/rollout_worker/0", "host:1")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        repo.wait("nrtest/w/never", timeout=0.3)
    assert time.monotonic() - t0 < 2
    assert "nrtest/w/never" in str(info.value)
    assert "rollout_worker/0" in str(info.value)


def test_keepalive_key_outlives_its_ttl_while_refreshed(repo):
    # Refreshed every TTL/3 by a thread: at a 0.3 s TTL a 0.2 s stall on a loaded host would lose it.
    repo.add("nrtest/k/alive", "x", keepalive_ttl=1.0)
    time.sleep(2.5)
    assert repo.get("nrtest/k/alive") == "x"


def test_reset_deletes_this_repository_keys_only_when_delete_on_exit(repo):
    repo.add("nrtest/r/mine", "1")
    repo.add("nrtest/r/kept", "2", delete_on_exit=False)
    repo.reset()
    assert repo.find_subtree("nrtest/r") == ["nrtest/r/kept"]


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    return env


@pytest.mark.system
def test_keys_of_a_sigkilled_process_expire_within_about_the_ttl(redis_url, no_leftover_processes):
    code = textwrap.dedent(f"""
        import time
        from realhf.api.cli_args import NameResolveConfig
        from realhf.base import name_resolve
        r = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url={redis_url!r}))
        r.add("nrtest/kill/hb", "pid", keepalive_ttl=3.0)
        print("ready", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=_child_env())
    repo = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=redis_url))
    try:
        assert child.stdout.readline().strip() == b"ready"
        # Longer than the TTL: only refreshes (every TTL/3) keep it. TTL 3 s, not 1: a child beside
        # another test on two loaded cores once missed its 0.33 s refreshes for a whole second.
        time.sleep(4.0)
        assert repo.get("nrtest/kill/hb") == "pid"
        child.send_signal(signal.SIGKILL)
        child.wait()
        t0 = time.monotonic()
        while repo.find_subtree("nrtest/kill/hb"):
            assert time.monotonic() - t0 < 4.5, "heartbeat of a killed process did not expire"
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        repo.close()


@pytest.mark.system
def test_eight_processes_adding_subentries_concurrently_lose_nothing(redis_url, no_leftover_processes):
    code = textwrap.dedent(f"""
        import sys
        from realhf.api.cli_args import NameResolveConfig
        from realhf.base import name_resolve
        r = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url={redis_url!r}))
        for i in range(50):
            r.add_subentry("nrtest/conc/entries", f"{{sys.argv[1]}}-{{i}}", delete_on_exit=False)
        r.add("nrtest/conc/winner", sys.argv[1], delete_on_exit=False) if False else None
        try:
            r.add("nrtest/conc/lock", sys.argv[1], delete_on_exit=False)
            print("won")
        except name_resolve.NameEntryExistsError:
            print("lost")
    """)
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(p)], stdout=subprocess.PIPE, env=_child_env())
        for p in range(8)
    ]
    outputs = [c.communicate(timeout=60)[0].decode().strip() for c in children]
    assert all(c.returncode == 0 for c in children)
    assert outputs.count("won") == 1, "SET NX must let exactly one process win"
    repo = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=redis_url))
    try:
        values = repo.get_subtree("nrtest/conc/entries")
        assert sorted(values) == sorted(f"{p}-{i}" for p in range(8) for i in range(50))
    finally:
        repo.clear_subtree("nrtest/conc")
        repo.close()


@pytest.mark.system
def test_module_level_functions_follow_reconfigure(redis_url):
    config = NameResolveConfig(type="redis", redis_url=redis_url)
    name_resolve.reconfigure(config)
    try:
        name_resolve.add("nrtest/mod/x", "1")
        other = name_resolve.make_repository(config)
        assert other.get("nrtest/mod/x") == "1"
        other.close()
    finally:
        name_resolve.clear_subtree("nrtest/mod")
        name_resolve.reconfigure(NameResolveConfig(type="memory"))


@pytest.mark.system
def test_redis_with_wrong_password_fails_clearly(redis_url):
    bad = redis_url.replace("realhf-test", "wrong")
    with pytest.raises(name_resolve.NameResolveError, match="password") as info:
        name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=bad))
    assert "wrong" not in str(info.value), "the password must not leak into messages"


def test_unknown_backend_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="name_resolve.type"):
        name_resolve.make_repository(NameResolveConfig(type="etcd"))
