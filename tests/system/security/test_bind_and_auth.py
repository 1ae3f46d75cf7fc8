"""Loopback by default, Redis with a password, safetensors only (issue 6, bullet 6)."""

import dataclasses
import os

import psutil
import pytest
import torch

from helpers.paths import REPO
from helpers.tiny_models import make_random_causal_lm
from realhf.api import cli_args, worker_configs
from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve
from realhf.base.redis_server import RedisServer

PASSWORD = "Zq7-redis-pw"  # distinctive, so a leak into a message is easy to spot


def _listening_ip(port: int) -> str:
    for c in psutil.Process().net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port:
            return c.laddr.ip
    raise AssertionError(f"nothing of this process listens on port {port}")


# ---- loopback unless configured ----------------------------------------------------------------


def test_every_host_field_of_the_config_tree_defaults_to_loopback():
    fields = [
        (cls.__name__, f.name, f.default)
        for cls in list(vars(cli_args).values()) + list(vars(worker_configs).values())
        if dataclasses.is_dataclass(cls) and isinstance(cls, type)
        for f in dataclasses.fields(cls)
        if f.name in ("host", "bind_host")
    ]
    assert fields, "no host fields found"
    assert all(default == "127.0.0.1" for _, _, default in fields), fields


def _load(*overrides):
    from realhf.experiments.config_loading import compose_config

    return compose_config(overrides)


def _hosts(obj, path="config"):
    """(path, value) of every host/bind_host field in a nested dataclass."""
    out = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in ("host", "bind_host"):
            out.append((f"{path}.{f.name}", value))
        elif dataclasses.is_dataclass(value):
            out += _hosts(value, f"{path}.{f.name}")
    return out


@pytest.mark.parametrize("override, expected", [((), "127.0.0.1"), (("cluster.bind_host=10.0.0.7",), "10.0.0.7")])
def test_every_worker_binds_where_cluster_bind_host_says(monkeypatch, override, expected):
    from realhf.experiments import file_validation
    from realhf.experiments.async_ppo import initial_setup

    monkeypatch.chdir(REPO)
    # 10.0.0.7 is no address of this machine, which the start refuses (check_bind_host, tested in
    # test_validation_bounds.py); here only where the value goes matters.
    monkeypatch.setattr(file_validation, "check_bind_host", lambda host, local: None)
    specs = initial_setup(_load(*override))
    hosts = [(s.worker_type, p, v) for s in specs for c in s.configs for p, v in _hosts(c)]
    assert {s.worker_type for s in specs} >= {"generation_server", "gserver_manager", "model_worker", "master_worker"}
    assert {w for w, _, _ in hosts} >= {"generation_server", "gserver_manager", "model_worker", "master_worker"}
    assert all(v == expected for _, _, v in hosts), hosts


def test_sockets_and_servers_listen_on_loopback_by_default(redis_name_resolve, native_server, manager_server):
    from realhf.system.streams.push_pull_stream import ZMQPuller
    from realhf.system.streams.request_reply_stream import MasterStream

    puller = ZMQPuller()
    master = MasterStream("bind", "t", n_workers=1)
    try:
        ports = {
            "trajectory puller": puller.port,
            "master ROUTER": int(master.address.rsplit(":", 1)[1]),
            "native server": int(native_server[0].rsplit(":", 1)[1]),
            "gserver manager": int(manager_server[0].rsplit(":", 1)[1]),
        }
        ips = {name: _listening_ip(port) for name, port in ports.items()}
        assert all(ip == "127.0.0.1" for ip in ips.values()), ips
    finally:
        puller.close()
        master.close()


def test_private_redis_server_listens_on_loopback_only(no_leftover_processes):
    with RedisServer() as server:
        conns = [c for c in psutil.Process(server.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
        assert conns and all(c.laddr.ip == "127.0.0.1" for c in conns), conns


# ---- Redis with a password ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_with_password():
    with RedisServer(password=PASSWORD) as server:
        yield server


def test_redis_url_with_password_works_against_requirepass(redis_with_password):
    url = redis_with_password.url
    assert url == f"redis://:{PASSWORD}@127.0.0.1:{redis_with_password.port}/0"
    repo = name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=url))
    try:
        repo.add("authtest/k", "v", replace=True)
        assert repo.get("authtest/k") == "v"
    finally:
        repo.reset()


@pytest.mark.parametrize("how, expected", [("wrong", "rejected the password"), ("missing", "requires a password")])
def test_bad_redis_password_fails_naming_the_url_but_not_the_password(redis_with_password, how, expected):
    good = redis_with_password.url
    url = good.replace(PASSWORD, "Wr0ng-" + PASSWORD[::-1]) if how == "wrong" else good.replace(f":{PASSWORD}@", "")
    with pytest.raises(name_resolve.NameResolveError, match=expected) as info:
        name_resolve.make_repository(NameResolveConfig(type="redis", redis_url=url))
    message = str(info.value)
    assert f"127.0.0.1:{redis_with_password.port}" in message
    assert PASSWORD not in message and PASSWORD[::-1] not in message


def test_malformed_redis_url_names_the_field_and_hides_the_password():
    with pytest.raises(name_resolve.NameResolveError, match=r"cluster\.name_resolve\.redis_url") as info:
        name_resolve.make_repository(
            NameResolveConfig(type="redis", redis_url=f"redis://:{PASSWORD}@127.0.0.1:notaport/0")
        )
    assert PASSWORD not in str(info.value)


# ---- safetensors only ----------------------------------------------------------------------------


def _pickle_only_checkpoint(src: str, dst) -> str:
    """The same model as `src`, but as pytorch_model.bin (a pickle) instead of model.safetensors."""
    from safetensors.torch import load_file

    dst.mkdir()
    for name in os.listdir(src):
        if name.endswith(".safetensors"):
            torch.save(load_file(os.path.join(src, name)), dst / "pytorch_model.bin")
        else:
            (dst / name).write_bytes(open(os.path.join(src, name), "rb").read())
    return str(dst)


@pytest.fixture(scope="module")
def pickle_only_models(tmp_path_factory):
    out = {}
    for arch in ("qwen2", "gpt2"):  # the static-KV engine's and the HF fallback's architectures
        src = make_random_causal_lm(str(tmp_path_factory.mktemp(f"{arch}_st")), arch, seed=0)
        out[arch] = _pickle_only_checkpoint(src, tmp_path_factory.mktemp(f"{arch}_bin_parent") / "model")
    return out


def test_trainer_refuses_a_checkpoint_without_safetensors(pickle_only_models):
    from realhf.api.cli_args import ModelTrainEvalConfig
    from realhf.impl.model.model_loading import load_causal_lm

    path = pickle_only_models["qwen2"]
    with pytest.raises(ValueError, match="safetensors") as info:
        load_causal_lm(ModelTrainEvalConfig(path=path))
    assert path in str(info.value)


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_inference_engines_refuse_a_checkpoint_without_safetensors(pickle_only_models, arch):
    from realhf.impl.inference.factory import create_engine

    with pytest.raises(Exception, match="safetensors"):
        create_engine(pickle_only_models[arch], max_running_requests=2, context_length=32)
