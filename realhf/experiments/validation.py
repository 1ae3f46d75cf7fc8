"""Every rule a config value must satisfy, in one place.

`check_values(cfg)` (of `realhf.experiments.validate.validate_experiment`) runs before any process starts (the entry point calls it through
`realhf.experiments`); `validate_worker_config(cfg)` (`realhf.experiments.worker_validation`, the same
rules applied to one worker's config) runs at every worker's entry, so a worker config written
by hand or by another tool is held to the same rules. Each refusal is a
`ConfigError` whose message names the field as the user spells it (`ppo.eps_clip`,
`rollout.agent.type`) and says what would work.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib.util
import math
import os
import threading
import typing
from typing import Any, Iterable, Optional

from realhf.api import algorithms, choices
from realhf.api.agent import load_reward_fn
from realhf.api.arguments import check_arguments
from realhf.api.cli_args import (
    AgentConfig,
    AsyncPPOConfig,
    EngineRunConfig,
    EnvConfig,
    EvaluationConfig,
    ExperimentSaveEvalControl,
    GenerationHyperparameters,
    LoRAConfig,
    ModelTrainEvalConfig,
    NameResolveConfig,
    NativeEngineConfig,
    OptimizerConfig,
    PPOHyperparameters,
    RayClusterConfig,
    RestartPolicyConfig,
    RMConfig,
    Rule,
    SFTConfig,
    SGLangConfig,
    StatsLoggingConfig,
    VLLMConfig,
)
from realhf.api.step_graph import GraphError
from realhf.api.trajectory import MAX_ABS_REWARD
from realhf.base.allocation_mode import AllocationMode
from realhf.base.importing import import_roots
from realhf.experiments.config_keys import unknown_key
from realhf.experiments.gpu_layout import run_placement
from realhf.impl.inference.request import MAX_STOP_TOKEN_IDS, MAX_TOP_K, TEMPERATURE_RANGE
from realhf.system.streams.push_pull_stream import grouping
from realhf.system.trainer.ppo_step import build_graph

# The config.json keys a critic must share with the actor: it is a value head on the actor's
# architecture, so it must read the same tokens (model_type, vocab_size) into the same width.
CRITIC_ARCH_KEYS = ("model_type", "vocab_size", "hidden_size")
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# The longest wait Python's threading accepts (Event.wait, Lock.acquire, queue.get: a longer one
# raises OverflowError; about 292 years): the bound of every timeout, which ends up in such a wait.
MAX_TIMEOUT_SECONDS = threading.TIMEOUT_MAX
# Every int of the config is an int64 where it ends up (torch tensors and generators, msgpack).
INT64_RANGE = (-(2**63), 2**63 - 1)


class ConfigError(ValueError):
    """A config value that cannot run; the message names the field."""


def check_external_servers(urls, alloc) -> None:
    """gen_server.urls: well-formed, distinct, as many as allocation_mode's generation part names."""
    from urllib.parse import urlsplit

    if not urls:
        return
    for i, url in enumerate(urls):
        parts = urlsplit(str(url))
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.port is None
            or parts.path not in ("", "/")
        ):
            raise ConfigError(f"gen_server.urls[{i}]={url!r}: want http://host:port (a running generation server)")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"gen_server.urls names a server twice: {list(urls)}")
    if len(urls) != alloc.gen.dp:
        raise ConfigError(
            f"gen_server.urls names {len(urls)} server(s) but allocation_mode={alloc} has d{alloc.gen.dp} in its "
            f"generation part: make it {alloc.gen_engine}.d{len(urls)}m{alloc.gen.tp}p{alloc.gen.pp}+..."
        )


class _Fields:
    """Checks over the fields of one config object; messages name `<prefix>.<field>`."""

    def __init__(self, obj: Any, prefix: str = ""):
        self.obj, self.prefix = obj, prefix

    def name(self, field: str) -> str:
        return f"{self.prefix}.{field}" if self.prefix else field

    def value(self, field: str) -> Any:
        obj = self.obj
        for part in field.split("."):
            obj = getattr(obj, part)
        return obj

    @staticmethod
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    def at_least(self, field: str, low: float, strict: bool = False) -> None:
        v = self.value(field)
        ok = v > low if strict else v >= low  # NaN fails both
        self.need(ok, f"{self.name(field)} must be {'>' if strict else '>='} {low}, got {v}")

    def at_most(self, field: str, high: float, why: str = "") -> None:
        v = self.value(field)
        self.need(v <= high, f"{self.name(field)} must be <= {high:g}{f' ({why})' if why else ''}, got {v}")

    def within(self, field: str, low: float, high: float) -> None:
        v = self.value(field)
        self.need(low <= v <= high, f"{self.name(field)} must lie in [{low}, {high}], got {v}")

    def plugin(self, field: str, menu) -> Any:
        """What `field` chooses from an open menu (realhf.api.algorithms): a built-in, a registered
        name or a `module:function` that imports here as it will in the workers."""
        try:
            return menu.get(self.value(field))
        except ValueError as e:
            raise ConfigError(str(e).replace(menu.field, self.name(field), 1)) from None

    def choice(self, field: str, options: Iterable[str]) -> None:
        v = self.value(field)
        self.need(v in options, f"{self.name(field)}={v!r}: choose one of {list(options)}")

    def timeout(self, field: str, zero_is_off: bool = False) -> None:
        """Seconds of a wait: > 0 (>= 0 where 0 turns it off), at most MAX_TIMEOUT_SECONDS."""
        self.at_least(field, 0, strict=not zero_is_off)
        self.at_most(field, MAX_TIMEOUT_SECONDS, "threading.TIMEOUT_MAX, the longest wait Python accepts")

    def temperature(self, field: str) -> None:
        """A sampling temperature the native generation server accepts (its request check's range)."""
        v, (lo, hi) = self.value(field), TEMPERATURE_RANGE
        self.need(
            v == 0 or lo <= v <= hi,
            f"{self.name(field)} must be 0 (greedy) or lie in [{lo}, {hi}] (the generation server's range), got {v}",
        )


# ---- every number of a config tree -------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _type_hints(cls: type) -> dict:
    return typing.get_type_hints(cls)


def _number_kind(tp: Any) -> Optional[type]:
    """int or float for a field typed int, float or Optional[int/float]; None for any other type."""
    if tp in (int, float):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union and len(args) == 1 and args[0] in (int, float):
        return args[0]
    return None


def _check_number(name: str, v: Any, kind: type, optional: bool) -> None:
    if v is None and optional:
        return
    # bool is an int to Python, but true/false in a numeric field is a mistake
    _Fields.need(isinstance(v, (int, float)) and not isinstance(v, bool), f"{name} must be a number, got {v!r}")
    _Fields.need(not isinstance(v, float) or math.isfinite(v), f"{name} must be a finite number, got {v}")
    if kind is int:
        _Fields.need(isinstance(v, int), f"{name} must be an integer, got {v}")
        lo, hi = INT64_RANGE
        _Fields.need(lo <= v <= hi, f"{name} must lie in [-2**63, 2**63 - 1] (an int64), got {v}")


def check_rule(f: "_Fields", name: str, rule: Rule) -> None:
    """One field's declared rule (cli_args.Rule), with the messages of the hand-written checks."""
    if f.value(name) is None:  # an Optional field left unset: the rule holds for a value
        return
    if rule.ge is not None:
        f.at_least(name, rule.ge)
    if rule.gt is not None:
        f.at_least(name, rule.gt, strict=True)
    if rule.within is not None:
        f.within(name, *rule.within)
    if rule.choices and rule.empty:
        v = f.value(name)
        f.need(
            v == "" or v in rule.choices, f"{f.name(name)}={v!r}: empty ({rule.empty}) or one of {list(rule.choices)}"
        )
    elif rule.choices:
        f.choice(name, rule.choices)
    if rule.timeout:
        f.timeout(name, zero_is_off=rule.timeout == "zero_off")


def check_fields(obj: Any, prefix: str = "") -> None:
    """Every number of the tree `obj` (check_numbers), then every field's declared rule, sections
    in declaration order; messages name the dotted field."""
    check_numbers(obj, prefix)
    check_rules(obj, prefix)


def check_rules(obj: Any, prefix: str = "", deep: bool = True) -> None:
    """Every declared rule of the fields of `obj` (and, `deep`, of its sections')."""
    if not dataclasses.is_dataclass(obj):
        return
    f = _Fields(obj, prefix)
    for fld in dataclasses.fields(obj):
        value = getattr(obj, fld.name)
        if dataclasses.is_dataclass(value):
            if deep:
                check_rules(value, f.name(fld.name))
        elif "rule" in fld.metadata:
            check_rule(f, fld.name, fld.metadata["rule"])


def check_numbers(obj: Any, prefix: str = "") -> None:
    """Every int and float field of the config tree `obj` (Optional ones when set, and the numbers
    in its List[...] and Dict[str, ...] fields): finite, of its field's type, ints within int64.
    NaN and +-inf pass many a range rule (`inf >= 0` holds) and fields without one, and fail only
    when a worker computes with them; one walk over the dataclasses' fields covers every field,
    including any added later. Messages name the dotted field."""
    if not dataclasses.is_dataclass(obj):
        return
    hints = _type_hints(type(obj))
    for fld in dataclasses.fields(obj):
        name = f"{prefix}.{fld.name}" if prefix else fld.name
        value, tp = getattr(obj, fld.name), hints.get(fld.name)
        if dataclasses.is_dataclass(value):
            check_numbers(value, name)
            continue
        kind = _number_kind(tp)
        if kind is not None:
            _check_number(name, value, kind, optional=kind is not tp)
            continue
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is list and args and _number_kind(args[0]) and isinstance(value, list):
            for i, item in enumerate(value):
                _check_number(f"{name}[{i}]", item, _number_kind(args[0]), optional=False)
        elif origin is dict and len(args) == 2 and _number_kind(args[1]) and isinstance(value, dict):
            for key, item in value.items():
                _check_number(f"{name}.{key}", item, _number_kind(args[1]), optional=False)


# ---- one sub-config at a time ------------------------------------------------------------------


def check_name_resolve(c: NameResolveConfig, prefix: str = "cluster.name_resolve") -> None:
    check_fields(c, prefix)


def check_restart_policy(c: RestartPolicyConfig, prefix: str = "cluster.restart_policy") -> None:
    check_fields(c, prefix)


WORKER_TYPES = ("generation_server", "gserver_manager", "model_worker", "rollout_worker", "master_worker", "evaluator")


def check_ray_cluster(c: RayClusterConfig, prefix: str = "cluster.ray") -> None:
    check_fields(c, prefix)
    for worker_type in WORKER_TYPES:
        for name, amount in getattr(c.resources, worker_type).items():
            if name in ("CPU", "GPU", "memory"):
                raise ConfigError(
                    f"{prefix}.resources.{worker_type}.{name}: CPUs and GPUs come from the workers' "
                    "threads and allocation_mode; list custom resources only"
                )
            if not 0 <= amount < math.inf:
                raise ConfigError(f"{prefix}.resources.{worker_type}.{name}={amount}: must be >= 0 and finite")


def check_device(name: str, field: str = "cluster.device") -> None:
    """A device name this machine can honour; a worker's copy names its own field."""
    _Fields.need(name in choices.DEVICES, f"{field}={name!r}: choose one of {list(choices.DEVICES)}")
    if name != "cuda":
        return  # 'auto' and 'cpu' run anywhere; only asking for a GPU needs torch to look for one
    from realhf.base.device import pick_device  # torch: the launcher, master and manager never load it otherwise

    try:
        pick_device(name)  # refuses a GPU device on a machine where torch sees none
    except ValueError as e:
        # pick_device's message speaks of cluster.device, the root field every copy comes from
        raise ConfigError(str(e) if field == "cluster.device" else f"{field}: {e}") from None


def _on_cpu(device: str) -> bool:
    """Whether `cluster.device=device` puts this machine's processes on the CPU (imports torch)."""
    from realhf.base.device import pick_device

    return pick_device(device).type == "cpu"


def check_generation(c: GenerationHyperparameters, prefix: str = "ppo.gen") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    f.temperature("temperature")  # RL further needs > 0 (validate_experiment)
    f.need(0 < c.top_p <= 1, f"{f.name('top_p')} must lie in (0, 1], got {c.top_p}")
    f.need(
        c.top_k == -1 or 1 <= c.top_k <= MAX_TOP_K,
        f"{f.name('top_k')} must be -1 (off) or lie in [1, {MAX_TOP_K}], got {c.top_k}",
    )
    f.need(
        0 <= c.min_new_tokens <= c.max_new_tokens,
        f"{f.name('min_new_tokens')} must lie in [0, {f.name('max_new_tokens')}={c.max_new_tokens}], got {c.min_new_tokens}",
    )
    f.need(
        all(t >= 0 for t in c.stop_token_ids),
        f"{f.name('stop_token_ids')} must be token ids >= 0, got {c.stop_token_ids}",
    )
    # The generation client adds the tokenizer's EOS to the list; the server takes MAX_STOP_TOKEN_IDS.
    f.need(
        len(c.stop_token_ids) < MAX_STOP_TOKEN_IDS,
        f"{f.name('stop_token_ids')} has {len(c.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS - 1} (the "
        f"generation server takes {MAX_STOP_TOKEN_IDS} stop ids per request, one of them the tokenizer's EOS)",
    )


def check_native_engine(c: NativeEngineConfig, prefix: str = "gen_server.native") -> None:
    check_fields(c, prefix)  # context_length: at most the model's too (realhf.experiments.file_validation)


def check_sglang(c: SGLangConfig, prefix: str = "gen_server.sglang") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    f.need(
        0 < c.mem_fraction_static <= 1,
        f"{f.name('mem_fraction_static')} must lie in (0, 1], got {c.mem_fraction_static}",
    )
    f.need(
        c.chunked_prefill_size == -1 or c.chunked_prefill_size >= 1,
        f"{f.name('chunked_prefill_size')} must be -1 (SGLang's default) or >= 1, got {c.chunked_prefill_size}",
    )


def check_vllm(c: VLLMConfig, prefix: str = "gen_server.vllm") -> None:
    check_fields(c, prefix)  # context_length: at most the model's too (realhf.experiments.file_validation)
    f = _Fields(c, prefix)
    f.need(
        0 < c.gpu_memory_utilization <= 1,
        f"{f.name('gpu_memory_utilization')} must lie in (0, 1], got {c.gpu_memory_utilization}",
    )


def _check_class(f: _Fields, field: str, lookup) -> None:
    """Resolve a registered name or `module:Class` now, so a typo fails before any process starts."""
    try:
        lookup(f.value(field))
    except ValueError as e:  # its message names the key, the path tried and what was missing
        raise ConfigError(str(e)) from None


def check_agent(c: AgentConfig, prefix: str = "rollout.agent") -> None:
    from realhf.api.agent import Agent, agent_class

    check_fields(c, prefix)
    f = _Fields(c, prefix)
    f.need(
        0.0 <= c.success_rate_lb <= 1.0 and 0.0 <= c.success_rate_ub <= 1.0,
        f"{f.name('success_rate_lb')}={c.success_rate_lb} and {f.name('success_rate_ub')}={c.success_rate_ub} "
        "must lie in [0, 1]",
    )
    f.need(
        c.success_rate_lb <= c.success_rate_ub,
        f"{f.name('success_rate_lb')}={c.success_rate_lb} > {f.name('success_rate_ub')}={c.success_rate_ub}: "
        "every group would be dropped",
    )
    _check_class(f, "type", agent_class)
    try:
        check_arguments(agent_class(c.type), Agent, dict(c.args or {}), f.name("args"))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _check_tools((c.args or {}).get("tools"), f.name("args") + ".tools")
    if c.reward_fn:
        try:
            load_reward_fn(c.reward_fn)
        except (ValueError, TypeError) as e:  # its message names the key
            raise ConfigError(str(e)) from None


def _check_tools(tools: Any, key: str) -> None:
    """Every tool an agent names loads (a misspelt built-in gets the closest name) before any
    process starts, instead of failing the first episode of every rollout worker."""
    if tools is None:
        return
    if isinstance(tools, str) or not isinstance(tools, collections.abc.Sequence):
        raise ConfigError(f"{key} must be a list of tool names, got {tools!r}")
    from realhf.api.tools import load_tool

    for name in tools:
        try:
            load_tool(name, key)
        except (ValueError, TypeError, ImportError, AttributeError) as e:
            raise ConfigError(str(e)) from None


def check_env(c: EnvConfig, prefix: str = "rollout.env") -> None:
    from realhf.api.env import Environment, env_class

    check_fields(c, prefix)
    f = _Fields(c, prefix)
    if c.type != "none":
        _check_class(f, "type", env_class)
        try:
            check_arguments(
                env_class(c.type), Environment, dict(c.args or {}), f.name("args"), methods=("__init__", "open_shared")
            )
            env_class(c.type).check_args(dict(c.args or {}), f.name("args"))
        except ValueError as e:
            raise ConfigError(str(e)) from None


def env_required_fields(c: EnvConfig) -> tuple:
    """The dataset fields the configured environment needs in every row."""
    from realhf.api.env import env_class

    return () if c.type == "none" else tuple(env_class(c.type).required_fields)


def check_optimizer(c: OptimizerConfig, prefix: str = "actor.optimizer") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    for name in ("beta1", "beta2"):
        f.need(0 <= f.value(name) < 1, f"{f.name(name)} must lie in [0, 1), got {f.value(name)}")
    f.need(
        0 <= c.warmup_steps_proportion < 1,
        f"{f.name('warmup_steps_proportion')} must lie in [0, 1), got {c.warmup_steps_proportion}",
    )


def check_model(c: ModelTrainEvalConfig, prefix: str) -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    check_optimizer(c.optimizer, f.name("optimizer"))
    _Fields.need(
        c.lora.r <= 0 or prefix == "actor",
        f"{prefix}.lora.r={c.lora.r}: only the actor trains LoRA adapters "
        "(with actor.lora the reference is the actor's base, adapters disabled)",
    )
    check_lora(c.lora, f.name("lora"))


def check_lora(c: LoRAConfig, prefix: str) -> None:
    """The adapters' own settings (the actor's, or the SFT run's)."""
    check_fields(c, prefix)
    lora = _Fields(c, prefix)
    if c.r > 0:  # the target modules are checked against the model when it loads (realhf.impl.model.lora)
        lora.at_least("alpha", 0, strict=True)
        lora.need(0 <= c.dropout < 1, f"{lora.name('dropout')} must lie in [0, 1), got {c.dropout}")
        lora.need(
            bool(c.target_modules),
            f"{lora.name('target_modules')} is empty: name the linear modules to adapt (e.g. q_proj, v_proj)",
        )
        lora.need(
            importlib.util.find_spec("peft") is not None,
            f"{lora.name('r')}={c.r} but peft is not installed: pip install 'realhf[lora]'",
        )


def check_lora_reference(actor: ModelTrainEvalConfig, ref: ModelTrainEvalConfig, ppo: PPOHyperparameters) -> None:
    """With actor.lora the reference (ppo.kl_ctl > 0) is the actor's frozen base, so no other one may be named."""
    _Fields.need(
        actor.lora.r == 0 or ppo.kl_ctl == 0 or ref.path in ("", actor.path),
        f"ref.path={ref.path!r}: with actor.lora.r={actor.lora.r} the reference is the actor's base "
        f"({actor.path!r}) with its adapters disabled; leave ref.path empty",
    )


def check_ppo(c: PPOHyperparameters, prefix: str = "ppo") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    est = f.plugin("adv_estimator", algorithms.ADV_ESTIMATORS)
    if c.prox_logp == "loglinear":
        f.need(
            c.use_decoupled_loss,
            f"{f.name('prox_logp')}=loglinear approximates the decoupled loss's proximal log-probs; "
            f"{f.name('use_decoupled_loss')} is false, so there are none to approximate",
        )
        f.need(
            not (c.kl_ctl > 0 and est.kl_in_reward),
            f"{f.name('prox_logp')}=loglinear: {f.name('adv_estimator')}={c.adv_estimator} with "
            f"{f.name('kl_ctl')}={c.kl_ctl} puts the KL in the reward, which needs the proximal log-probs "
            "before training; use prox_logp=recompute or kl_ctl=0",
        )
    loss = f.plugin("policy_loss", algorithms.POLICY_LOSSES)
    f.need(
        c.c_clip is None or loss.clipped,
        f"{f.name('c_clip')}={c.c_clip}: the dual clip bounds a clipped loss, and "
        f"{f.name('policy_loss')}={c.policy_loss} has none",
    )
    if c.kl_target > 0:
        f.need(
            c.kl_ctl > 0,
            f"{f.name('kl_target')}={c.kl_target} adapts the KL coefficient starting from "
            f"{f.name('kl_ctl')}, which must then be > 0 (got {c.kl_ctl})",
        )
        f.at_least("kl_horizon", 0, strict=True)
    # Trainer-side shaping, (reward + bias) * scaling: a reward of 1 must stay within the bound
    # every reward is held to (MAX_ABS_REWARD, realhf.api.trajectory), or float32 statistics overflow.
    for name in ("reward_output_scaling", "reward_output_bias"):
        f.need(
            abs(f.value(name)) <= MAX_ABS_REWARD,
            f"{f.name(name)} must lie in [-{MAX_ABS_REWARD:g}, "
            f"{MAX_ABS_REWARD:g}] (MAX_ABS_REWARD), got {f.value(name)}",
        )
    check_generation(c.gen, f.name("gen"))
    try:  # the step's graph: a dropped node still read, a cycle, an unknown op or model
        build_graph(c)
    except GraphError as e:
        raise ConfigError(str(e)) from None


def check_exp_ctrl(c: ExperimentSaveEvalControl, prefix: str = "exp_ctrl") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    if c.benchmark_steps == 0:
        f.at_least("total_train_epochs", 0, strict=True)


def check_evaluation_during(c: EvaluationConfig, prefix: str = "evaluation") -> None:
    """The settings of the evaluations during training (exp_ctrl.eval_freq_steps > 0)."""
    f = _Fields(c, prefix)
    for name in ("during_n_prompts", "during_samples", "during_n_threads", "max_new_tokens", "batch_size"):
        f.at_least(name, 1)
    f.temperature("sampled_temperature")  # the evaluator samples on the native engine
    f.within("during_nice", 0, 19)


def check_stats(c: StatsLoggingConfig, prefix: str = "stats") -> None:
    check_fields(c, prefix)
    f = _Fields(c, prefix)
    for field, module, extra in (
        ("wandb_project", "wandb", "wandb"),
        ("tensorboard_path", "tensorboard", "tensorboard"),
    ):
        f.need(
            not f.value(field) or importlib.util.find_spec(module) is not None,
            f"{f.name(field)}={f.value(field)!r} but {module} is not installed: pip install 'realhf[{extra}]'",
        )


def check_engine_run(c: EngineRunConfig) -> None:
    """What training/main_sft.py and training/main_rm.py share (each a root of its own)."""
    f = _Fields(c)
    for name in ("model_path", "output_path", "train_path"):
        f.need(bool(f.value(name)), f"{name} is required (pass {name}=...)")
    check_fields(c)
    check_device(c.device, "device")
    check_lora(c.lora, "lora")


def check_sft(c: SFTConfig) -> None:
    """training/main_sft.py's config."""
    check_engine_run(c)
    _Fields(c).need(
        c.eval_n < 0 or bool(c.test_path), "test_path is required for the accuracy report (or pass eval_n=-1)"
    )


def check_rm(c: RMConfig) -> None:
    """training/main_rm.py's config."""
    check_engine_run(c)
    f = _Fields(c)
    f.need(c.eval_n < 0 or bool(c.test_path), "test_path is required for the pair-accuracy report (or pass eval_n=-1)")


# ---- the experiment ----------------------------------------------------------------------------


def check_known_keys(obj: Any, prefix: str = "", root: Optional[type] = None) -> None:
    """Refuse keys that are no field of their config, naming the closest valid keys: Hydra's
    `+key=value` adds a key without checking it against the schema, so a misspelt `+` override
    would otherwise be ignored."""
    if not dataclasses.is_dataclass(obj):
        return
    root = root or (None if prefix else type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key in vars(obj):
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            why = (unknown_key(where, root) if root else None) or f"{where}: no such field"
            raise ConfigError(f"{why}; a '+' override adds keys the schema does not know")
    for name in names:
        check_known_keys(getattr(obj, name), f"{prefix}.{name}" if prefix else name, root)


def check_user_paths(paths: Iterable[str], launch_dir: Optional[str] = None) -> None:
    """user_paths: directories that exist (relative ones from the launch directory), checked before
    any process starts or imports from them."""
    launch_dir, paths = launch_dir or os.getcwd(), list(paths)
    for i, (path, full) in enumerate(zip(paths, import_roots(launch_dir, paths)[1:])):
        _Fields.need(
            bool(path) and os.path.isdir(full),
            f"user_paths[{i}]={path!r}: {full} is not a directory (a relative path is read from the launch "
            f"directory {launch_dir}); name a directory that holds your modules, or remove it",
        )


def check_gpu_placement(cfg: AsyncPPOConfig, alloc: AllocationMode) -> None:
    """cluster.gpu_placement and gen_memory_fraction, and whether allocation_mode's processes fit
    the cluster's GPUs that way (realhf.experiments.gpu_layout)."""
    f = _Fields(cfg)
    f.choice("cluster.gpu_placement", choices.GPU_PLACEMENTS)
    fraction = cfg.cluster.gen_memory_fraction
    f.need(
        0 < fraction < 1,
        f"cluster.gen_memory_fraction must lie in (0, 1) (the generation server's part of a GPU it shares with "
        f"a trainer rank, which keeps the rest), got {fraction}",
    )
    f.need(
        alloc.gen_engine != "sglang" or cfg.cluster.device != "cpu",
        f"allocation_mode={cfg.allocation_mode!r}: the {alloc.gen_engine} engine runs on GPUs, but cluster.device=cpu "
        "keeps the whole run on the CPU; use cluster.device=auto or cuda, or the native or vllm engine",
    )
    if alloc.gen_engine == "vllm" and not cfg.gen_server.urls:
        from realhf.impl.inference.vllm_launcher import VLLMMissing, vllm_python

        try:  # that the interpreter is there; whether it imports vllm, the server's start says
            vllm_python(cfg.gen_server.vllm, check=False)
        except VLLMMissing as e:
            raise ConfigError(str(e)) from None
    try:
        placement = run_placement(cfg, alloc)
    except ValueError as e:
        raise ConfigError(f"allocation_mode: {e}") from None
    if cfg.cluster.launcher == "ray":
        for i, slot in enumerate(placement.servers):
            # Ray hands out a fraction of one GPU, or whole GPUs: not a part of each of several.
            f.need(
                len(slot.gpus) <= 1 or slot.memory_fraction == 1,
                f"cluster.launcher=ray: generation server {i} would share its {len(slot.gpus)} GPUs (m{alloc.gen.tp} "
                f"p{alloc.gen.pp}) with trainer ranks (cluster.gpu_placement={cfg.cluster.gpu_placement} placed them "
                f"{placement.mode}), but Ray lends a fraction of one GPU only; use cluster.gpu_placement=separate "
                "with enough GPUs, or servers of one GPU (m1p1)",
            )


def check_values(cfg: AsyncPPOConfig) -> AllocationMode:
    """Raise ConfigError naming the first value that cannot work; return the parsed allocation.
    (The files it names and the shapes that tie values together: `realhf.experiments.validate`.)"""
    check_known_keys(cfg)
    check_fields(cfg)  # first: NaN, +-inf, wrong types and every field's declared rule, named
    f = _Fields(cfg)
    try:
        alloc = AllocationMode.parse(cfg.allocation_mode)
        alloc.validate()
    except ValueError as e:
        raise ConfigError(f"allocation_mode: {e}") from None
    f.need(
        cfg.cluster.n_nodes == 1 or cfg.cluster.launcher != "local",
        f"cluster.n_nodes={cfg.cluster.n_nodes}: the local launcher runs on one node; use cluster.launcher=ray",
    )
    f.need(
        not cfg.cluster.worker_template or (cfg.cluster.launcher == "local" and cfg.cluster.fork_workers),
        f"cluster.worker_template={cfg.cluster.worker_template}: a shared template serves the local launcher's "
        f"forked workers, but cluster.launcher={cfg.cluster.launcher} and cluster.fork_workers="
        f"{str(cfg.cluster.fork_workers).lower()}; leave cluster.worker_template empty",
    )
    check_ray_cluster(cfg.cluster.ray)
    for name in ("experiment_name", "trial_name"):
        value = f.value(name)  # both become name-resolve key prefixes and directory names
        f.need(
            bool(value) and set(value) <= _NAME_CHARS and not value.startswith("."),
            f"{name}={value!r}: use letters, digits, '_', '-' and '.' only (not leading '.'), non-empty",
        )
    f.need(bool(cfg.cluster.fileroot), "cluster.fileroot is empty")
    check_name_resolve(cfg.cluster.name_resolve)
    check_restart_policy(cfg.cluster.restart_policy)
    check_device(cfg.cluster.device)
    check_gpu_placement(cfg, alloc)

    check_external_servers(cfg.gen_server.urls, alloc)
    check_agent(cfg.rollout.agent)
    check_env(cfg.rollout.env)

    check_ppo(cfg.ppo)
    f.need(
        cfg.ppo.gen.temperature > 0,
        f"ppo.gen.temperature must be > 0 for RL (got {cfg.ppo.gen.temperature}): greedy rollouts give every "
        "answer of a group the same reward",
    )
    check_model(cfg.actor, "actor")
    check_model(cfg.ref, "ref")
    check_model(cfg.critic, "critic")
    check_model(cfg.reward, "reward")
    f.need(
        bool(cfg.reward.path) or "reward" not in build_graph(cfg.ppo).models(),
        "a reward_model node of the step (ppo.graph.add) runs on `reward`, whose path is empty: set "
        "reward.path=<training/main_rm.py's output>",
    )
    check_lora_reference(cfg.actor, cfg.ref, cfg.ppo)
    check_native_engine(cfg.gen_server.native)
    check_sglang(cfg.gen_server.sglang)
    check_vllm(cfg.gen_server.vllm)
    f.need(
        cfg.gen_server.native.decode_attention != "kernel" or _on_cpu(cfg.cluster.device),
        f"gen_server.native.decode_attention=kernel is a CPU kernel, but cluster.device={cfg.cluster.device!r} "
        "puts the engine on a GPU; use 'auto' or 'torch'",
    )
    check_exp_ctrl(cfg.exp_ctrl)
    check_stats(cfg.stats)
    ev = _Fields(cfg.evaluation, "evaluation")
    if cfg.evaluation.n_prompts > 0:
        ev.at_least("max_new_tokens", 0, strict=True)
        ev.at_least("batch_size", 0, strict=True)
        ev.temperature("sampled_temperature")
    if cfg.exp_ctrl.eval_freq_steps > 0:  # the evaluator during training
        check_evaluation_during(cfg.evaluation)

    return alloc


def check_shapes(cfg: AsyncPPOConfig, alloc: AllocationMode) -> None:
    """Rules that tie the batch, the DP size and the rollout workers together."""
    need = _Fields.need
    dp, B = alloc.train.dp, cfg.groups_per_step
    # Checked before divisibility: "16 % 32" would blame groups_per_step for what is a DP size too large.
    need(
        dp <= B,
        f"allocation_mode={cfg.allocation_mode!r} trains on {dp} DP ranks, more than groups_per_step={B} groups per "
        f"step: every DP rank needs at least one group; lower the trainer part's d<N> to at most {B} or raise "
        "groups_per_step",
    )
    need(B % dp == 0, f"groups_per_step={B} must be divisible by the trainer's DP size {dp} (allocation_mode)")
    samples_per_rank = B * cfg.group_size // dp
    need(
        cfg.ppo.ppo_n_minibatches <= samples_per_rank,
        f"ppo.ppo_n_minibatches={cfg.ppo.ppo_n_minibatches} exceeds the {samples_per_rank} samples a DP rank trains on "
        "per step (groups_per_step x group_size / DP): some minibatches would be empty",
    )
    # DP rank 0 picks the logged samples from its own share (no other rank's text travels).
    need(
        cfg.stats.log_completions <= samples_per_rank,
        f"stats.log_completions={cfg.stats.log_completions} exceeds the {samples_per_rank} samples DP rank 0 trains "
        "per step (groups_per_step x group_size / DP), which it picks them from: lower it",
    )
    check_rollout_workers(cfg, dp, rollout_workers(cfg, dp))


def rollout_workers(cfg: AsyncPPOConfig, dp: int, resumed: int = 0) -> int:
    """How many rollout workers the run starts: rollout.n_workers; where it is 0, as many as the
    run being resumed had (`resumed`: its prompt orders are sharded over that many), else two per
    trainer DP rank (each worker feeds one rank; a second keeps it fed while one restarts)."""
    return cfg.rollout.n_workers or resumed or 2 * dp


def resumed_rollout_workers(cfg: AsyncPPOConfig, dp: int, resumed: int, checkpoint: str) -> int:
    """The rollout workers of a run that resumes `checkpoint`, whose run had `resumed` (0: none
    recorded, or a fresh start): each worker's prompt order is its own shard of the prompts, so
    the count must stay; checked here, since validation saw only the config's count."""
    if resumed and cfg.rollout.n_workers not in (0, resumed):
        raise ConfigError(
            f"rollout.n_workers={cfg.rollout.n_workers}, but the run this one resumes ({checkpoint}) had "
            f"{resumed} rollout workers, each with its own shard of the prompts and its place in it: "
            f"resume with rollout.n_workers={resumed} (or 0, the default, which keeps it), or start a new trial"
        )
    n_workers = rollout_workers(cfg, dp, resumed)
    if n_workers != rollout_workers(cfg, dp):
        check_rollout_workers(
            cfg,
            dp,
            n_workers,
            whose=f"rollout.n_workers=0 keeps the {n_workers} rollout workers of the run it resumes (its prompt "
            "orders are sharded over them)",
        )
    return n_workers


def check_rollout_workers(cfg: AsyncPPOConfig, dp: int, n_workers: int, whose: str = "") -> None:
    """Whether `n_workers` rollout workers can feed `dp` ranks; `whose` says where the count came
    from when it is not rollout.n_workers."""
    need = _Fields.need
    what = whose or f"rollout.n_workers={n_workers}"
    need(n_workers >= dp, f"{what}: fewer rollout workers than trainer DP size {dp}; every DP rank needs one")
    # Starvation: a DP rank waits for B/dp groups, all of which come from its own rollout
    # workers; if those may not keep that many in flight, the step never fills.
    share, per_worker = cfg.groups_per_step // dp, rollouts_per_worker(cfg, n_workers)
    for rank, senders in grouping(n_workers, dp).items():
        room = per_worker * len(senders)
        need(
            room >= share,
            f"max_concurrent_rollouts={cfg.max_concurrent_rollouts} over {n_workers} rollout workers lets "
            f"DP rank {rank} have only {room} groups in flight, but each train step needs {share} from it: "
            f"raise max_concurrent_rollouts to at least {share * math.ceil(n_workers / len(senders))}"
            + (f" ({whose})" if whose else ""),
        )


def rollouts_per_worker(cfg: AsyncPPOConfig, n_workers: int) -> int:
    """Each of the `n_workers` rollout workers' share of max_concurrent_rollouts."""
    return max(1, cfg.max_concurrent_rollouts // n_workers)
