"""Which recovery checkpoint a resumed run starts from (realhf.experiments.async_ppo.resume_point):
the launcher verifies and chooses once, before any worker starts, and hands the choice to every
model worker, so that no rank decides on its own (docs/architecture.md §12.3)."""

import logging

import pytest
import torch

from helpers.fsdp_ranks import engine_config, open_engines, run_steps
from helpers.paths import REPO
from realhf.base.trial_files import recover_dir, recover_prev_dir
from realhf.experiments.async_ppo import initial_setup, resumed_from, trial_files_of
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validation import ConfigError
from realhf.impl.model import recover_checkpoint as recover_ckpt


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


def _cfg(tmp_path, mode):
    return compose_config([f"cluster.fileroot={tmp_path}", "trial_name=t", f"recover_mode={mode}"])


def _two_checkpoints(run_dir):
    torch.set_num_threads(1)
    with open_engines(engine_config()) as (actor,):
        recover_ckpt.save(recover_dir(run_dir), {"actor": actor}, 0, 1, actor.device, extra={"version": 1, "step": 1})
        run_steps(actor, [0], 0, 1)
        recover_ckpt.save(recover_dir(run_dir), {"actor": actor}, 0, 1, actor.device, extra={"version": 2, "step": 2})


def _truncate_a_shard(checkpoint):
    shard = next((checkpoint / "actor").glob("*.distcp"))
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    return shard


def _model_workers(specs):
    return next(s.configs for s in specs if s.worker_type == "model_worker")


def test_every_model_worker_is_handed_the_checkpoint_the_launcher_verified_and_chose(tmp_path, caplog):
    cfg = _cfg(tmp_path, "resume")
    run_dir = trial_files_of(cfg).run_dir
    _two_checkpoints(run_dir)
    shard = _truncate_a_shard(recover_dir(run_dir))
    with caplog.at_level(logging.WARNING, logger="recover_checkpoint"):
        specs = initial_setup(cfg)
        path, info = resumed_from(specs)  # what the entry point prints
    assert all(w.recover and w.recover_path == str(recover_prev_dir(run_dir)) for w in _model_workers(specs))
    assert info["version"] == 1 and path == str(recover_prev_dir(run_dir))
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "recover_checkpoint" and r.levelno == logging.WARNING
    ]
    assert len(warnings) == 1 and shard.name in warnings[0]  # verified once, however often asked


def test_an_undamaged_newest_checkpoint_is_the_one_resumed(tmp_path):
    cfg = _cfg(tmp_path, "auto")
    run_dir = trial_files_of(cfg).run_dir
    _two_checkpoints(run_dir)
    specs = initial_setup(cfg)
    assert all(w.recover_path == str(recover_dir(run_dir)) for w in _model_workers(specs))
    assert resumed_from(specs)[1]["version"] == 2


@pytest.mark.parametrize("mode", ["auto", "resume"])
def test_only_damaged_checkpoints_are_a_config_error_naming_each(tmp_path, mode):
    cfg = _cfg(tmp_path, mode)
    run_dir = trial_files_of(cfg).run_dir
    _two_checkpoints(run_dir)
    newest, previous = _truncate_a_shard(recover_dir(run_dir)), _truncate_a_shard(recover_prev_dir(run_dir))
    with pytest.raises(ConfigError) as e:
        initial_setup(cfg)
    assert f"recover_mode={mode}: no recovery checkpoint under {run_dir} is whole" in str(e.value)
    assert f"{recover_dir(run_dir)}: actor/{newest.name} has" in str(e.value)
    assert f"{recover_prev_dir(run_dir)}: actor/{previous.name} has" in str(e.value)


def test_a_fresh_trial_hands_the_workers_no_checkpoint(tmp_path):
    specs = initial_setup(_cfg(tmp_path, "auto"))
    assert all(not w.recover and w.recover_path == "" for w in _model_workers(specs))
    assert resumed_from(specs) is None


def _checkpoint_of_a_run_with(run_dir, rollout_workers):
    torch.set_num_threads(1)
    with open_engines(engine_config()) as (actor,):
        extra = {"version": 1, "step": 1, "rollout_workers": rollout_workers}
        recover_ckpt.save(recover_dir(run_dir), {"actor": actor}, 0, 1, actor.device, extra=extra)


def _rollout_workers(specs):
    spec = next(s for s in specs if s.worker_type == "rollout_worker")
    master = next(s.configs[0] for s in specs if s.worker_type == "master_worker")
    assert spec.count == len(spec.configs) == master.expected_workers["rollout_worker"]
    return spec.count


def test_a_resumed_run_keeps_the_rollout_workers_its_prompt_orders_are_sharded_over(tmp_path):
    cfg = _cfg(tmp_path, "resume")
    _checkpoint_of_a_run_with(trial_files_of(cfg).run_dir, rollout_workers=4)  # a DP=2 run's default
    assert _rollout_workers(initial_setup(cfg)) == 4  # resumed at DP=1, where the default is 2
    cfg.rollout.n_workers = 4
    assert _rollout_workers(initial_setup(cfg)) == 4
    cfg.rollout.n_workers = 3  # another count would resume each worker's place in another shard
    with pytest.raises(ConfigError, match="rollout.n_workers=3, but the run this one resumes .* had 4 rollout workers"):
        initial_setup(cfg)


def test_a_resumed_run_with_too_few_rollout_workers_for_its_dp_size_is_refused_saying_why(tmp_path):
    cfg = compose_config([f"cluster.fileroot={tmp_path}", "trial_name=t", "recover_mode=resume",
                          "allocation_mode=native.d1m1p1+d2m1p1"])  # fmt: skip
    _checkpoint_of_a_run_with(trial_files_of(cfg).run_dir, rollout_workers=1)
    with pytest.raises(ConfigError, match="rollout.n_workers=0 keeps the 1 rollout workers of the run it resumes"):
        initial_setup(cfg)
