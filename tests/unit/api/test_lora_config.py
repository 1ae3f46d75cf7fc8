"""actor.lora is validated before any process starts (realhf.experiments.validation), and the same rules
hold for a model worker's own config (realhf.experiments.worker_validation)."""

import pytest

from helpers.paths import REPO, TINY_MATH
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validate import validate_experiment as check_config
from realhf.experiments.validation import ConfigError
from realhf.experiments.worker_validation import validate_worker_config


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


REFUSED = [
    ("actor.lora.r=-1", "actor.lora.r"),
    ("actor.lora.r=8 actor.lora.alpha=0", "actor.lora.alpha"),
    ("actor.lora.r=8 actor.lora.dropout=1.0", "actor.lora.dropout"),
    ("actor.lora.r=8 actor.lora.dropout=-0.1", "actor.lora.dropout"),
    ("actor.lora.r=8 actor.lora.target_modules=[]", "actor.lora.target_modules"),
    ("ref.lora.r=8", "ref.lora.r"),
    ("critic.lora.r=4", "critic.lora.r"),
    # the reference of a LoRA actor is its own base: naming another one cannot be honoured
    ("actor.lora.r=8 ppo.kl_ctl=0.1 ref.path=/elsewhere", "ref.path"),
]


@pytest.mark.parametrize("override, field", REFUSED, ids=[o for o, _ in REFUSED])
def test_lora_value_that_cannot_run_is_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        check_config(compose_config(override.split()))
    assert field in str(e.value)


def test_a_lora_actor_with_the_defaults_validates():
    check_config(compose_config(["actor.lora.r=8", "ppo.kl_ctl=0.1"]))


def test_a_model_worker_config_with_a_bad_lora_is_refused_naming_the_field():
    cfg = ModelWorkerConfig()
    cfg.actor.path = f"{TINY_MATH}/sft"
    cfg.actor.lora.r, cfg.actor.lora.dropout = 8, 1.5
    with pytest.raises(ConfigError, match="actor.lora.dropout"):
        validate_worker_config(cfg)
