"""The experiment config: YAML ↔ dataclasses, overrides, and refusals before any process starts."""

import os
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from realhf.api.cli_args import AsyncPPOMATHConfig
from realhf.experiments.async_ppo_math import ConfigError, check_config, initial_setup

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG_DIR = os.path.join(REPO, "training", "configs")
sys.path.insert(0, os.path.join(REPO, "training"))
import main_async_ppo  # noqa: E402,F401  (registers the schema with Hydra's ConfigStore)


def load(*overrides) -> AsyncPPOMATHConfig:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="async-ppo", overrides=list(overrides))
    return OmegaConf.to_object(cfg)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


def _leaf_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaf_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_every_yaml_key_is_a_dataclass_field():
    with open(os.path.join(CONFIG_DIR, "async-ppo.yaml")) as f:
        doc = yaml.safe_load(f)
    doc.pop("defaults"), doc.pop("hydra")
    schema = OmegaConf.structured(AsyncPPOMATHConfig)
    for key in _leaf_keys(doc):
        assert OmegaConf.select(schema, key, default="__missing__") != "__missing__", f"{key} is not a field"


def test_defaults_compose_into_the_typed_config_and_pass_the_checks():
    cfg = load()
    assert isinstance(cfg, AsyncPPOMATHConfig)
    assert cfg.max_head_offpolicyness == 4 and cfg.group_size == 8
    check_config(cfg)


def test_misspelt_override_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as e:
        load("max_head_offpolicy=3")
    assert "max_head_offpolicy" in str(e.value) + str(e.value.__cause__)


def test_wrong_type_override_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as e:
        load("group_size=many")
    assert "group_size" in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize(
    "override, field",
    [
        ("allocation_mode=native.d1m2p1+d1m1p1", "allocation_mode"),
        ("allocation_mode=sglang.d1m1p1+d1m1p1", "allocation_mode"),
        ("allocation_mode=native.d1+d1+d1", "allocation_mode"),
        ("group_size=0", "group_size"),
        ("dataset.train_bs_n_seqs=-1", "dataset.train_bs_n_seqs"),
        ("max_head_offpolicyness=-1", "max_head_offpolicyness"),
        ("success_rate_lb=0.9 success_rate_ub=0.5", "success_rate_lb"),
        ("actor.path=/nonexistent/model", "actor.path"),
        ("dataset.path=/nonexistent.jsonl", "dataset.path"),
        ("schedule_policy=fastest", "schedule_policy"),
        ("recover_mode=sometimes", "recover_mode"),
        ("ppo.gen.temperature=0", "ppo.gen.temperature"),
        ("max_concurrent_rollouts=8", "max_concurrent_rollouts"),
        ("wandb_project=demo wandb_mode=sometimes", "wandb"),
        ("allocation_mode=native.d1+d2 dataset.train_bs_n_seqs=15", "train_bs_n_seqs"),
        ("allocation_mode=native.d1+d4 rollout.n_workers=2 dataset.train_bs_n_seqs=16", "rollout.n_workers"),
    ],
)
def test_values_that_cannot_run_are_refused_naming_the_field(override, field):
    cfg = load(*override.split())
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_config(cfg)


def test_initial_setup_gives_every_worker_type_its_share():
    cfg = load("allocation_mode=native.d2+d2", "rollout.n_workers=3", "max_concurrent_rollouts=30")
    specs = {s.worker_type: s for s in initial_setup(cfg)}
    assert specs["generation_server"].count == 2 and specs["gserver_manager"].count == 1
    assert specs["model_worker"].count == 2 and specs["rollout_worker"].count == 3
    assert specs["master_worker"].count == 1 and specs["master_worker"].echo_log
    rollout = specs["rollout_worker"].configs[0]
    assert rollout.n_pullers == 2 and rollout.max_concurrent_rollouts == 10 and rollout.group_size == 8
    manager = specs["gserver_manager"].configs[0]
    assert (manager.train_batch_size, manager.max_head_offpolicyness, manager.n_servers) == (16, 4, 2)
    assert specs["model_worker"].configs[0].fileroot == manager.fileroot  # weights written where the manager reads


def test_command_line_rejects_a_bad_value_before_starting_anything(tmp_path):
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", "max_head_offpolicyness=-2", f"cluster.fileroot={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "max_head_offpolicyness must be >= 0" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched
