"""The trainer's recovery checkpoint (realhf/impl/model/recover_checkpoint.py) at DP=1, in this
process, with a real actor and critic FSDPEngine: what a resumed trainer gets back, and what a
save that dies half-way leaves behind. (DP=2: tests/unit/impl/engine/test_fsdp_engine.py.)"""

import random

import pytest
import torch

from realhf.impl.model import recover_checkpoint

from helpers.fsdp_ranks import (
    critic_config,
    engine_config,
    full_params,
    open_engines,
    run_critic_steps,
    run_steps,
)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _configs(shard_single_rank: bool = False):
    return engine_config(shard_single_rank=shard_single_rank), critic_config(shard_single_rank=shard_single_rank)


def _step(actor, critic, step: int):
    return run_steps(actor, [step], 0, 1)[0], run_critic_steps(critic, [step], 0, 1)[0]


def _params(actor, critic):
    return {"actor": full_params(actor), "critic": full_params(critic)}


def _max_abs_diff(a: dict, b: dict) -> float:
    return max(float((a[role][k] - b[role][k]).abs().max()) for role in a for k in a[role])


def _save(path, actor, critic, **extra):
    return recover_checkpoint.save(path, {"actor": actor, "critic": critic}, 0, 1, actor.device, extra=extra)


@pytest.mark.parametrize("shard_single_rank", [False, True], ids=["unwrapped", "fsdp"])
def test_fresh_engines_resume_exactly_where_the_saved_ones_were(tmp_path, shard_single_rank):
    path = tmp_path / "recover"
    with open_engines(*_configs(shard_single_rank)) as (actor, critic):
        _step(actor, critic, 0)
        _save(path, actor, critic, version=3, global_step=3, consumed_groups=48)
        saved = _params(actor, critic)
        rng_after_save = (torch.rand(4), random.random())
        uninterrupted = _step(actor, critic, 1)
        want = _params(actor, critic)
        want_epochs = (actor.lr_scheduler.last_epoch, critic.lr_scheduler.last_epoch)
    torch.manual_seed(1234)  # a restarted process has other RNG states
    random.seed(1234)

    with open_engines(*_configs(shard_single_rank)) as (actor, critic):
        assert _max_abs_diff(_params(actor, critic), saved) > 1e-4  # fresh weights differ before the load
        info = recover_checkpoint.load(path, {"actor": actor, "critic": critic}, 0, actor.device)
        rng_after_load = (torch.rand(4), random.random())
        assert _max_abs_diff(_params(actor, critic), saved) == 0.0
        resumed = _step(actor, critic, 1)
        got = _params(actor, critic)
        epochs = (actor.lr_scheduler.last_epoch, critic.lr_scheduler.last_epoch)
    assert info["version"] == 3 and info["global_step"] == 3 and info["consumed_groups"] == 48
    assert torch.equal(rng_after_load[0], rng_after_save[0]) and rng_after_load[1] == rng_after_save[1]
    # Same weights, Adam moments and LR: the next update is the uninterrupted one.
    assert _max_abs_diff(got, want) <= 1e-7
    assert epochs == want_epochs == (2, 2)
    for a, b in zip(resumed, uninterrupted):
        assert a["lr"] == b["lr"] and a["loss"] == pytest.approx(b["loss"], abs=1e-7)


def test_read_info_returns_the_counters_the_version_and_what_was_saved(tmp_path):
    assert recover_checkpoint.read_info(tmp_path / "recover") is None
    with open_engines(*_configs()) as (actor, critic):
        _save(tmp_path / "recover", actor, critic, version=7, global_step=9)
    assert recover_checkpoint.read_info(tmp_path / "recover") == {
        "version": 7, "global_step": 9, "dp_size": 1, "roles": ["actor", "critic"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recover"]  # the temporary directory was renamed


def test_a_save_that_fails_midway_leaves_the_previous_checkpoint_intact_and_loadable(tmp_path, monkeypatch):
    path = tmp_path / "recover"
    with open_engines(*_configs()) as (actor, critic):
        _save(path, actor, critic, version=1)
        saved = _params(actor, critic)
        files = sorted(str(p.relative_to(path)) for p in path.rglob("*"))
        _step(actor, critic, 0)

        def dies_after_a_file(dest):
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "partial.distcp").write_bytes(b"half")
            raise OSError("killed while writing the critic")

        monkeypatch.setattr(critic, "save_recover", dies_after_a_file)
        with pytest.raises(OSError, match="killed while writing the critic"):
            _save(path, actor, critic, version=2)
    assert recover_checkpoint.read_info(path)["version"] == 1
    assert sorted(str(p.relative_to(path)) for p in path.rglob("*")) == files
    with open_engines(*_configs()) as (actor, critic):
        recover_checkpoint.load(path, {"actor": actor, "critic": critic}, 0, actor.device)
        assert _max_abs_diff(_params(actor, critic), saved) == 0.0


def test_a_leftover_temporary_directory_of_a_killed_save_is_replaced(tmp_path):
    leftover = tmp_path / ".tmp-recover"
    (leftover / "actor").mkdir(parents=True)
    (leftover / "actor" / "__0_0.distcp").write_bytes(b"from a save that was killed")
    with open_engines(*_configs()) as (actor, critic):
        _save(tmp_path / "recover", actor, critic, version=5)
        assert not leftover.exists()
        assert recover_checkpoint.read_info(tmp_path / "recover")["version"] == 5
        assert recover_checkpoint.load(tmp_path / "recover", {"actor": actor, "critic": critic}, 0,
                                       actor.device)["version"] == 5


def test_loading_a_role_the_checkpoint_lacks_names_the_role(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        recover_checkpoint.save(tmp_path / "recover", {"actor": actor}, 0, 1, actor.device, extra={"version": 1})
        with pytest.raises(ValueError, match=r"no state for \['critic'\]"):
            recover_checkpoint.load(tmp_path / "recover", {"actor": actor, "critic": critic}, 0, actor.device)
        with pytest.raises(FileNotFoundError, match="no recovery checkpoint"):
            recover_checkpoint.load(tmp_path / "nothing", {"actor": actor}, 0, actor.device)
