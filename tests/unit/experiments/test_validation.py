"""Invalid config values and dataset rows are refused before any process starts, naming the
field (issue 6, bullet 5). Complements tests/unit/experiments/test_async_ppo.py (which
covers eta < 0, lb > ub, missing paths, group_size=0, ...) and
tests/unit/impl/dataset/test_prompt_dataset.py (the loader's own file:line messages): here, what
realhf.experiments.validation adds on top."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO, TINY_MATH
from realhf.api.cli_args import AgentConfig, ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
from realhf.api.worker_configs import GenerationServerConfig, ModelWorkerConfig
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validate import validate_experiment as check_config
from realhf.experiments.validation import ConfigError, check_agent, check_optimizer
from realhf.experiments.worker_validation import validate_worker_config

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")
SFT = os.path.join(TINY_MATH, "sft")


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
    ("allocation_mode=trtllm.d1+d1", "allocation_mode"),
    ("allocation_mode=vllm.d1+d1 gen_server.vllm.python=/no/such/python", "gen_server.vllm.python"),
    ("gen_server.vllm.dtype=fp8", "gen_server.vllm.dtype"),
    # sizes <= 0
    ("max_concurrent_rollouts=0", "max_concurrent_rollouts"),
    ("rollout.n_workers=-1", "rollout.n_workers"),
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
    ("ppo.prox_logp=linear", "ppo.prox_logp"),
    ("ppo.prox_logp=loglinear ppo.use_decoupled_loss=false", "ppo.use_decoupled_loss"),
    ("ppo.prox_logp=loglinear ppo.adv_estimator=gae", "ppo.adv_estimator=gae with ppo.kl_ctl=0.1"),
    ("ppo.discount=2", "ppo.discount"),
    # the trainer engine, the critic and the device (issue 13)
    ("cluster.device=gpu", "cluster.device"),
    ("ppo.adv_estimator=ppo", "ppo.adv_estimator"),
    ("ppo.value_eps_clip=0", "ppo.value_eps_clip"),
    ("ppo.critic_warmup_steps=-1", "ppo.critic_warmup_steps"),
    ("critic.dtype=float8", "critic.dtype"),
    ("critic.optimizer.lr=-1", "critic.optimizer.lr"),
    ("actor.param_dtype=fp8", "actor.param_dtype"),
    ("actor.optimizer.max_nonfinite_steps=-1", "actor.optimizer.max_nonfinite_steps"),
    ("actor.reduce_dtype=half", "actor.reduce_dtype"),
    # the launcher and its Ray cluster (issue 15)
    ("cluster.launcher=slurm", "cluster.launcher"),
    ("cluster.n_nodes=2", "cluster.launcher=ray"),
    ("cluster.launcher=ray cluster.ray.placement_strategy=RANDOM", "cluster.ray.placement_strategy"),
    ("cluster.launcher=ray cluster.ray.placement_timeout=0", "cluster.ray.placement_timeout"),
    ("cluster.launcher=ray +cluster.ray.resources.model_worker.CPU=2", "cluster.ray.resources.model_worker.CPU"),
    (
        "cluster.launcher=ray +cluster.ray.resources.generation_server.node_a=-1",
        "cluster.ray.resources.generation_server.node_a",
    ),
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


@pytest.mark.parametrize(
    "bad_line, what",
    [
        ("{not json", "not valid JSON"),
        ('{"query_id": "x", "prompt": "p", "task": "math"}', "missing field 'solutions'"),
    ],
)
@pytest.mark.parametrize("field", ["dataset.path", "dataset.test_path"])
def test_bad_dataset_row_is_refused_with_file_and_line(tmp_path, bad_line, what, field):
    path = _dataset_with_bad_line(tmp_path, bad_line)
    with pytest.raises(ConfigError) as e:
        check_config(load(f"{field}={path}"))
    assert f"{field}: {path}:41: " in str(e.value) and what in str(e.value)


@pytest.mark.system
def test_command_line_refuses_a_bad_dataset_row_before_starting_anything(tmp_path):
    path = _dataset_with_bad_line(tmp_path, "{not json")
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", f"dataset.path={path}", f"cluster.fileroot={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{path}:41:" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


@pytest.mark.parametrize(
    "field,value,message",
    [
        (
            "lr_scheduler_type",
            "linear",
            r"actor.optimizer.lr_scheduler_type='linear': choose one of \['constant', 'cosine'\]",
        ),
        ("type", "sgd", r"actor.optimizer.type='sgd': choose one of \['adam'\]"),
        ("warmup_steps_proportion", 1.0, r"actor.optimizer.warmup_steps_proportion must lie in \[0, 1\)"),
    ],
)
def test_bad_optimizer_settings_fail_naming_the_field(field, value, message):
    with pytest.raises(ConfigError, match=message):
        check_optimizer(OptimizerConfig(**{field: value}))


def test_agent_config_rejects_inverted_success_bounds():
    with pytest.raises(ConfigError, match="rollout.agent.success_rate_lb"):
        check_agent(AgentConfig(success_rate_lb=0.9, success_rate_ub=0.1))


def test_sft_config_is_refused_naming_the_field():
    from realhf.api.cli_args import SFTConfig
    from realhf.experiments.validation import check_sft

    with pytest.raises(ConfigError, match=r"model_path is required"):
        check_sft(SFTConfig())
    ok = dict(model_path="m", output_path="o", train_path="t", eval_n=-1)
    check_sft(SFTConfig(**ok))
    with pytest.raises(ConfigError, match=r"^steps must be >= 1, got 0"):
        check_sft(SFTConfig(**ok, steps=0))
    with pytest.raises(ConfigError, match=r"test_path is required"):
        check_sft(SFTConfig(**{**ok, "eval_n": 0}))


# ---- issue 13: the device, the critic, the trainer's parallelism ---------------------------------


def test_the_default_config_validates():
    alloc = check_config(load())
    assert str(alloc) == "native.d1m1p1+d1m1p1"


def _gpus(monkeypatch, n: int) -> None:
    """What torch reports about GPUs, whatever this machine has."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_cuda_device_without_a_gpu_is_refused_naming_cluster_device(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match=r"^cluster\.device=cuda but torch sees no GPU"):
        check_config(load("cluster.device=cuda"))
    check_config(load("cluster.device=auto"))  # auto falls back to the CPU
    check_config(load("cluster.device=cpu"))


def test_worker_configs_refuse_a_cuda_device_without_a_gpu_naming_their_field(monkeypatch):
    _gpus(monkeypatch, 0)
    with pytest.raises(ConfigError, match=r"^generation_server\.device: cluster\.device=cuda"):
        validate_worker_config(GenerationServerConfig(model_path=SFT, device="cuda"))
    with pytest.raises(ConfigError, match=r"^device: cluster\.device=cuda"):
        validate_worker_config(ModelWorkerConfig(actor=ModelTrainEvalConfig(path=SFT), device="cuda"))
    with pytest.raises(ConfigError, match=r"^generation_server\.device='gpu': choose one of"):
        validate_worker_config(GenerationServerConfig(model_path=SFT, device="gpu"))


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_gpu_device_with_gpus_per_node_set_is_fine(monkeypatch, device):
    _gpus(monkeypatch, 8)
    check_config(load(f"cluster.device={device}", "cluster.n_gpus_per_node=8"))
    validate_worker_config(GenerationServerConfig(model_path=SFT, device=device))


def test_the_cpu_decode_attention_kernel_is_refused_on_a_gpu_naming_the_field(monkeypatch):
    _gpus(monkeypatch, 8)
    with pytest.raises(ConfigError, match=r"^gen_server\.native\.decode_attention=kernel is a CPU kernel"):
        check_config(load("cluster.device=cuda", "gen_server.native.decode_attention=kernel"))
    check_config(load("cluster.device=cpu", "gen_server.native.decode_attention=kernel"))


def _model_dir(tmp_path, name: str, **changes) -> str:
    """A copy of the tiny SFT model's config.json with `changes` (no weights: only the config is read)."""
    with open(os.path.join(SFT, "config.json")) as f:
        config = json.load(f)
    config.update(changes)
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize(
    "key, value, actor_value",
    [
        ("hidden_size", 64, 128),
        ("model_type", "llama", "qwen2"),
        ("vocab_size", 512, 258),
    ],
)
def test_gae_refuses_a_critic_of_another_architecture_naming_critic_path(tmp_path, key, value, actor_value):
    critic = _model_dir(tmp_path, "critic", **{key: value})
    with pytest.raises(ConfigError) as e:
        check_config(load("ppo.adv_estimator=gae", f"critic.path={critic}"))
    message = str(e.value)
    assert message.startswith(f"critic.path={critic!r} has {key}={value!r} (actor: {actor_value!r})"), message
    # the model worker holds a hand-written config to the same rule
    ppo = PPOHyperparameters(adv_estimator="gae")
    with pytest.raises(ConfigError, match=r"^critic\.path=.* has " + key):
        validate_worker_config(
            ModelWorkerConfig(actor=ModelTrainEvalConfig(path=SFT), critic=ModelTrainEvalConfig(path=critic), ppo=ppo)
        )


def test_gae_critic_must_be_an_hf_model_directory(tmp_path):
    with pytest.raises(ConfigError, match=r"^critic\.path=.* is not an HF model directory \(no config\.json\)"):
        check_config(load("ppo.adv_estimator=gae", f"critic.path={tmp_path}"))


def test_gae_accepts_the_actors_architecture(tmp_path):
    check_config(load("ppo.adv_estimator=gae"))  # empty critic.path: the actor's own directory
    check_config(load("ppo.adv_estimator=gae", f"critic.path={_model_dir(tmp_path, 'same')}"))
    check_config(load("ppo.adv_estimator=gae", f"critic.path={os.path.join(TINY_MATH, 'base')}"))
    # without gae the critic is never loaded, so its path is not read
    check_config(load("ppo.adv_estimator=reinforce", f"critic.path={_model_dir(tmp_path, 'other', hidden_size=64)}"))


def test_dp_larger_than_the_batch_is_refused_naming_allocation_mode_and_groups_per_step():
    cfg = load("allocation_mode=native.d1+d4", "groups_per_step=2", "rollout.n_workers=4")
    with pytest.raises(
        ConfigError,
        match=r"^allocation_mode='native\.d1\+d4' trains on 4 DP ranks, more than "
        r"groups_per_step=2 groups per step",
    ):
        check_config(cfg)


def test_trainer_tp_and_pp_are_checked_against_the_models():
    from realhf.experiments.file_validation import check_trainer_split

    check_trainer_split(load("allocation_mode=native.d1+d1m2"), 2, 1)  # 4 heads, 4 kv heads, MLP 512
    check_trainer_split(load("allocation_mode=native.d1+d1m2p2"), 2, 2)  # 2 layers, 2 stages
    with pytest.raises(ConfigError, match=r"m3 tensor-parallel ranks, but actor.path=.* num_attention_heads=4.*lower"):
        check_trainer_split(load("allocation_mode=native.d1+d1m3"), 3, 1)
    check_trainer_split(load("allocation_mode=native.d1+d1m2", "actor.lora.r=4"), 2, 1)  # adapters split too
    with pytest.raises(
        ConfigError, match=r"p3 pipeline stages, but actor.path=.* 2 decoder layers .*lower the trainer part's p"
    ):
        check_trainer_split(load("allocation_mode=native.d1+d1p3"), 1, 3)
    with pytest.raises(ConfigError, match=r"p2 pipeline stages, and LoRA adapters \(actor.lora.r=4\) are not built"):
        check_trainer_split(load("allocation_mode=native.d1+d1p2", "actor.lora.r=4"), 1, 2)


@pytest.mark.system
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["cluster.device=cuda"], "cluster.device=cuda but torch sees no GPU"),
        (
            ["allocation_mode=native.d1+d4", "groups_per_step=2", "rollout.n_workers=4"],
            "trains on 4 DP ranks, more than groups_per_step=2",
        ),
    ],
)
def test_command_line_refuses_issue_13_bad_inputs_before_starting_anything(tmp_path, overrides, message):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # torch sees no GPU, even on a GPU machine
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", *overrides, f"cluster.fileroot={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


def test_a_multi_node_ray_config_with_pinned_workers_is_accepted():
    cfg = load("cluster.launcher=ray", "cluster.n_nodes=2", "+cluster.ray.resources.generation_server.node_a=1")
    check_config(cfg)
    assert cfg.cluster.ray.resources.generation_server == {"node_a": 1.0}


@pytest.mark.parametrize(
    "override, field",
    [
        ("+cluster.ray.resources.model_wroker.node_a=1", "cluster.ray.resources.model_wroker"),
        ("+actor.lrr=1", "actor.lrr"),
    ],
)
def test_a_key_added_with_plus_that_is_no_field_is_refused(override, field):
    with pytest.raises(ConfigError, match=f"{field}: no such field"):
        check_config(load(override))


def test_a_message_limit_below_the_largest_group_the_config_can_make_is_refused_with_the_size_it_needs():
    # 8 samples that fill the tiny model's 256-token context: ~101 KB (realhf.experiments.file_validation).
    with pytest.raises(
        ConfigError,
        match=r"cluster.max_message_bytes=3000 is smaller than the largest prompt group "
        r"this config can produce \(~101376 bytes.*at least 101376",
    ):
        check_config(load("cluster.max_message_bytes=3000"))
    check_config(load("cluster.max_message_bytes=101376"))
