"""The trainer's recovery checkpoint (realhf/impl/model/recover_checkpoint.py) at DP=1, in this
process, with a real actor and critic FSDPEngine: what a resumed trainer gets back, and what a
save that dies half-way leaves behind, and how a damaged one is found on resume: the previous
checkpoint kept beside it, the manifest each is verified against. (DP=2:
tests/unit/impl/engine/test_fsdp_engine.py.)"""

import errno
import json
import logging
import random

import pytest
import torch

from helpers.fsdp_ranks import (
    critic_config,
    engine_config,
    full_params,
    open_engines,
    run_critic_steps,
    run_steps,
)
from realhf.impl.model import checkpoint, recover_checkpoint


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
@pytest.mark.filterwarnings("error:FSDP2-wrapped module:UserWarning")  # the critic's output, read out of place
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
        "version": 7,
        "global_step": 9,
        "dp_size": 1,
        "roles": ["actor", "critic"],
    }
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
        assert (
            recover_checkpoint.load(tmp_path / "recover", {"actor": actor, "critic": critic}, 0, actor.device)[
                "version"
            ]
            == 5
        )


def test_loading_a_role_the_checkpoint_lacks_names_the_role(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        recover_checkpoint.save(tmp_path / "recover", {"actor": actor}, 0, 1, actor.device, extra={"version": 1})
        with pytest.raises(ValueError, match=r"no state for \['critic'\]"):
            recover_checkpoint.load(tmp_path / "recover", {"actor": actor, "critic": critic}, 0, actor.device)
        with pytest.raises(FileNotFoundError, match="no recovery checkpoint"):
            recover_checkpoint.load(tmp_path / "nothing", {"actor": actor}, 0, actor.device)


# ---- two checkpoints, verified on resume (issue 27 item 8) ----------------------------------------


def _listing(path):
    return sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file())


def _truncate(f):
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    return size


def _shard(path, role="actor"):
    return next((path / role).glob("*.distcp"))


def _saved_twice(tmp_path, actor, critic):
    """Version 1, a step, version 2; returns the engines' parameters at version 1."""
    _save(tmp_path / "recover", actor, critic, version=1)
    v1 = _params(actor, critic)
    _step(actor, critic, 0)
    _save(tmp_path / "recover", actor, critic, version=2)
    return v1


def test_a_second_save_keeps_the_replaced_checkpoint_as_recover_prev_and_both_verify(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _saved_twice(tmp_path, actor, critic)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recover", "recover.prev"]
    newest, previous = tmp_path / "recover", tmp_path / "recover.prev"
    assert recover_checkpoint.read_info(newest)["version"] == 2
    assert recover_checkpoint.read_info(previous)["version"] == 1
    assert recover_checkpoint.verify(newest) is None and recover_checkpoint.verify(previous) is None
    # The manifest lists every other file of the checkpoint, with its size.
    manifest = json.loads((newest / "manifest.json").read_text())["files"]
    assert sorted(manifest) == [f for f in _listing(newest) if f != "manifest.json"]
    assert {"recover_info.json", "rng/rank0.pt", "actor/lr_schedule.json", "critic/.metadata"} <= set(manifest)
    assert all(manifest[f]["size"] == (newest / f).stat().st_size for f in manifest)
    path, info = recover_checkpoint.choose(tmp_path)
    assert path == newest and info["version"] == 2


def test_a_truncated_shard_of_the_newest_is_named_and_resume_falls_back_to_the_previous_one(tmp_path, caplog):
    with open_engines(*_configs()) as (actor, critic):
        v1 = _saved_twice(tmp_path, actor, critic)
    shard = _shard(tmp_path / "recover")
    size = _truncate(shard)
    rel = shard.relative_to(tmp_path / "recover").as_posix()
    assert recover_checkpoint.verify(tmp_path / "recover") == (
        f"{tmp_path / 'recover'}: {rel} has {size // 2} bytes, expected {size}"
    )

    with caplog.at_level(logging.WARNING, logger="recover_checkpoint"):
        path, info = recover_checkpoint.choose(tmp_path)
    assert path == tmp_path / "recover.prev" and info["version"] == 1
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"{tmp_path / 'recover'}: {rel} has" in warning and f"{tmp_path / 'recover.prev'} (version 1)" in warning
    with open_engines(*_configs()) as (actor, critic):
        assert recover_checkpoint.load(path, {"actor": actor, "critic": critic}, 0, actor.device)["version"] == 1
        assert _max_abs_diff(_params(actor, critic), v1) == 0.0


def test_a_changed_byte_of_the_same_size_fails_the_checksum(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _save(tmp_path / "recover", actor, critic, version=1)
    shard = _shard(tmp_path / "recover", "critic")
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    rel = shard.relative_to(tmp_path / "recover").as_posix()
    assert recover_checkpoint.verify(tmp_path / "recover", checksums=False) is None  # sizes still match
    assert recover_checkpoint.verify(tmp_path / "recover") == (
        f"{tmp_path / 'recover'}: {rel} fails its checksum (its sha256 is not the manifest's)"
    )


def test_a_damaged_previous_and_a_damaged_newest_make_an_error_naming_both(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _saved_twice(tmp_path, actor, critic)
    _truncate(_shard(tmp_path / "recover"))
    (tmp_path / "recover.prev" / "rng" / "rank0.pt").unlink()
    with pytest.raises(recover_checkpoint.DamagedCheckpointError) as e:
        recover_checkpoint.choose(tmp_path)
    message = str(e.value)
    assert f"no recovery checkpoint under {tmp_path} is whole" in message
    assert f"{tmp_path / 'recover'}: {_shard(tmp_path / 'recover').relative_to(tmp_path / 'recover')} has" in message
    assert f"{tmp_path / 'recover.prev'}: rng/rank0.pt is missing" in message
    assert "recover_mode=disabled" in message  # and what to do


def test_a_checkpoint_without_a_manifest_is_reported_as_one_from_an_older_version(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _save(tmp_path / "recover", actor, critic, version=1)
    (tmp_path / "recover" / "manifest.json").unlink()
    problem = recover_checkpoint.verify(tmp_path / "recover")
    assert problem.startswith(f"{tmp_path / 'recover'}: no manifest.json") and "older" in problem
    with pytest.raises(recover_checkpoint.DamagedCheckpointError, match="no manifest.json"):
        recover_checkpoint.choose(tmp_path)


def test_no_checkpoint_at_all_is_no_choice_and_no_error(tmp_path):
    assert recover_checkpoint.choose(tmp_path) is None


def test_the_next_save_drops_a_visibly_damaged_newest_instead_of_keeping_it_as_the_previous(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _saved_twice(tmp_path, actor, critic)
        _truncate(_shard(tmp_path / "recover"))
        _save(tmp_path / "recover", actor, critic, version=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recover", "recover.prev"]
    assert recover_checkpoint.read_info(tmp_path / "recover")["version"] == 3
    assert recover_checkpoint.read_info(tmp_path / "recover.prev")["version"] == 1  # the whole one stays
    assert recover_checkpoint.verify(tmp_path / "recover.prev") is None


def test_loading_a_damaged_checkpoint_names_the_bad_file_instead_of_a_bare_eof(tmp_path):
    with open_engines(*_configs()) as (actor, critic):
        _save(tmp_path / "recover", actor, critic, version=1)
        shard = _shard(tmp_path / "recover")
        _truncate(shard)
        with pytest.raises(
            recover_checkpoint.DamagedCheckpointError, match=f"cannot load actor .*{shard.name} has .* bytes, expected"
        ):
            recover_checkpoint.load(tmp_path / "recover", {"actor": actor, "critic": critic}, 0, actor.device)


def test_without_an_atomic_exchange_three_saves_still_keep_the_two_newest(tmp_path, monkeypatch):
    def no_exchange(a, b):  # as on NFS
        raise OSError(errno.EINVAL, "not supported")

    monkeypatch.setattr(checkpoint, "_exchange", no_exchange)
    with open_engines(*_configs()) as (actor, critic):
        for version in (1, 2, 3):
            _save(tmp_path / "recover", actor, critic, version=version)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recover", "recover.prev"]  # no `.old-*` left
    assert recover_checkpoint.read_info(tmp_path / "recover")["version"] == 3
    assert recover_checkpoint.read_info(tmp_path / "recover.prev")["version"] == 2
    assert recover_checkpoint.verify(tmp_path / "recover") is None
    assert recover_checkpoint.verify(tmp_path / "recover.prev") is None
