"""Invalid config values and dataset rows are refused before any process starts, naming the
field (issue 6, bullet 5). Complements tests/unit/experiments/test_async_ppo_math.py (which
covers eta < 0, lb > ub, missing paths, group_size=0, ...) and
tests/unit/impl/dataset/test_prompt_dataset.py (the loader's own file:line messages): here, what
realhf.api.validation adds on top."""

import os
import subprocess
import sys

import pytest

from realhf.api.cli_args import AgentConfig, OptimizerConfig
from realhf.api.validation import ConfigError, check_agent, check_optimizer
from realhf.api.validation import validate_experiment as check_config
from realhf.experiments.config_loading import compose_config

from helpers.paths import REPO, TINY_MATH

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")


def load(*overrides):
    return compose_config(overrides)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


REFUSED = [
    # allocation_mode garbage
    ("allocation_mode=garbage", "allocation_mode"),
    ("allocation_mode=''", "allocation_mode"),
    ("allocation_mode=native.d0m1p1+d1m1p1", "allocation_mode"),
    ("allocation_mode=vllm.d1+d1", "allocation_mode"),
    # sizes <= 0
    ("max_concurrent_rollouts=0", "max_concurrent_rollouts"),
    ("rollout.n_workers=0", "rollout.n_workers"),
    ("ppo.ppo_n_minibatches=0", "ppo.ppo_n_minibatches"),
    ("ppo.gen.max_new_tokens=0", "ppo.gen.max_new_tokens"),
    ("actor.n_threads=0", "actor.n_threads"),
    ("exp_ctrl.benchmark_steps=-1", "exp_ctrl.benchmark_steps"),
    ("exp_ctrl.ckpt_freq_steps=-1", "exp_ctrl.ckpt_freq_steps"),
    ("exp_ctrl.benchmark_steps=0 exp_ctrl.total_train_epochs=0", "exp_ctrl.total_train_epochs"),
    ("rollout.request_timeout=0", "rollout.request_timeout"),
    ("stall_timeout=-1", "stall_timeout"),
    ("evaluation.batch_size=0", "evaluation.batch_size"),
    ("gen_server.native.context_length=-1", "gen_server.native.context_length"),
    ("ppo.ppo_n_minibatches=1000", "ppo.ppo_n_minibatches"),
    ("ppo.gen.max_new_tokens=100000", "ppo.gen.max_new_tokens"),
    # sampling and optimisation values a worker would only trip over later
    ("ppo.gen.top_p=0", "ppo.gen.top_p"),
    ("ppo.gen.top_k=0", "ppo.gen.top_k"),
    ("ppo.gen.min_new_tokens=100", "ppo.gen.min_new_tokens"),
    ("actor.optimizer.lr=-1", "actor.optimizer.lr"),
    ("actor.optimizer.lr=nan", "actor.optimizer.lr"),
    ("actor.optimizer.beta2=1.5", "actor.optimizer.beta2"),
    ("actor.optimizer.lr_scheduler_type=linear", "actor.optimizer.lr_scheduler_type"),
    ("actor.dtype=float8", "actor.dtype"),
    ("ppo.kl_ctl=-0.1", "ppo.kl_ctl"),
    ("ppo.kl_estimator=k9", "ppo.kl_estimator"),
    ("ppo.discount=2", "ppo.discount"),
    # names become key prefixes and directories
    ("trial_name=a/b", "trial_name"),
    ("experiment_name=..", "experiment_name"),
    ("cluster.fileroot=''", "cluster.fileroot"),
]


@pytest.mark.parametrize("override, field", REFUSED, ids=[o for o, _ in REFUSED])
def test_value_that_cannot_run_is_refused_naming_the_field(override, field):
    cfg = load(*override.split())
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    assert field in str(e.value)


def _dataset_with_bad_line(tmp_path, bad_line: str, n_good: int = 40) -> str:
    with open(TRAIN) as f:
        good = [next(f) for _ in range(n_good)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(good) + bad_line + "\n")
    return str(path)


@pytest.mark.parametrize("bad_line, what", [
    ("{not json", "not valid JSON"),
    ('{"query_id": "x", "prompt": "p", "task": "math"}', "missing field 'solutions'"),
])
@pytest.mark.parametrize("field", ["dataset.path", "dataset.test_path"])
def test_bad_dataset_row_is_refused_with_file_and_line(tmp_path, bad_line, what, field):
    path = _dataset_with_bad_line(tmp_path, bad_line)
    with pytest.raises(ConfigError) as e:
        check_config(load(f"{field}={path}"))
    assert f"{field}: {path}:41: " in str(e.value) and what in str(e.value)


def test_command_line_refuses_a_bad_dataset_row_before_starting_anything(tmp_path):
    path = _dataset_with_bad_line(tmp_path, "{not json")
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", f"dataset.path={path}", f"cluster.fileroot={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{path}:41:" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


@pytest.mark.parametrize("field,value,message", [
    ("lr_scheduler_type", "linear", r"actor.optimizer.lr_scheduler_type='linear': choose one of \['constant', 'cosine'\]"),
    ("type", "sgd", r"actor.optimizer.type='sgd': choose one of \['adam'\]"),
    ("warmup_steps_proportion", 1.0, r"actor.optimizer.warmup_steps_proportion must lie in \[0, 1\)"),
])
def test_bad_optimizer_settings_fail_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        check_optimizer(OptimizerConfig(**{field: value}))


def test_agent_config_rejects_inverted_success_bounds():
    with pytest.raises(ConfigError, match="rollout.agent.success_rate_lb"):
        check_agent(AgentConfig(success_rate_lb=0.9, success_rate_ub=0.1))


def test_sft_config_is_refused_naming_the_field():
    from realhf.api.cli_args import SFTConfig
    from realhf.api.validation import check_sft

    with pytest.raises(ConfigError, match=r"model_path is required"):
        check_sft(SFTConfig())
    ok = dict(model_path="m", output_path="o", train_path="t", eval_n=-1)
    check_sft(SFTConfig(**ok))
    with pytest.raises(ConfigError, match=r"^steps must be >= 1, got 0"):
        check_sft(SFTConfig(**ok, steps=0))
    with pytest.raises(ConfigError, match=r"test_path is required"):
        check_sft(SFTConfig(**{**ok, "eval_n": 0}))
