"""The experiment checks that read files: the model directories (a hub id resolved to its local
snapshot first), the critic's architecture against the actor's, and every row of the datasets,
so that a bad path or row fails before any process starts, naming the field, the file and the row.
Called by `validation.validate_experiment` after the checks of the values themselves."""

from __future__ import annotations

import itertools
import json
import os

from realhf.api.cli_args import AsyncPPOMATHConfig, DatasetColumnsConfig
from realhf.api.validation import CRITIC_ARCH_KEYS, ConfigError, _Fields, env_required_fields
from realhf.base.model_source import ModelPathError, resolve_model_path
from realhf.impl.dataset.prompt_encoding import CHAT_TEMPLATE_SETTINGS


def check_files(cfg: AsyncPPOMATHConfig) -> None:
    need = _Fields.need
    # A hub repo id becomes its local snapshot here, once: every worker config derived from cfg
    # then names the same files. Offline, it fails now, naming the field.
    for name, model in (("actor.path", cfg.actor), ("ref.path", cfg.ref), ("critic.path", cfg.critic)):
        try:
            model.path = resolve_model_path(name, model.path)
        except ModelPathError as e:
            raise ConfigError(str(e)) from None
    for name in ("actor.path", "dataset.path"):
        path = _Fields(cfg).value(name)
        need(bool(path), f"{name} is empty")
        need(os.path.exists(path), f"{name}={path!r} does not exist (relative paths are from {os.getcwd()})")
    need(os.path.isfile(os.path.join(cfg.actor.path, "config.json")),
         f"actor.path={cfg.actor.path!r} is not an HF model directory (no config.json)")
    if cfg.ppo.kl_ctl > 0 and cfg.ref.path:
        need(os.path.isfile(os.path.join(cfg.ref.path, "config.json")),
             f"ref.path={cfg.ref.path!r} is not an HF model directory (no config.json)")
    if cfg.ppo.adv_estimator == "gae":
        check_critic_matches_actor(cfg.critic.path, cfg.actor.path)
    if cfg.evaluation.n_prompts > 0:
        need(os.path.exists(cfg.dataset.test_path),
             f"dataset.test_path={cfg.dataset.test_path!r} does not exist (set evaluation.n_prompts=0 to skip evaluation)")
    context = cfg.gen_server.native.context_length or _max_positions(cfg.actor.path)
    if context:
        need(cfg.ppo.gen.max_new_tokens < context,
             f"ppo.gen.max_new_tokens={cfg.ppo.gen.max_new_tokens} leaves no room for a prompt in the generation "
             f"servers' context of {context} tokens (gen_server.native.context_length, 0: the model's "
             "max_position_embeddings)")
    # Parse every row now, so a malformed row fails here naming file, row and column, not in a worker later.
    ds = cfg.dataset
    check_dataset_columns(ds.columns)
    n_rows = len(load_rows("dataset.path", ds.path, env_required_fields(cfg.rollout.env), ds.columns, ds.split))
    if cfg.evaluation.n_prompts > 0:  # math accuracy: solutions needed
        load_rows("dataset.test_path", ds.test_path, columns=ds.columns, split=ds.test_split)
    if cfg.exp_ctrl.eval_freq_steps > 0:
        need(os.path.exists(ds.test_path), f"dataset.test_path={ds.test_path!r} does not exist "
             "(the evaluator of exp_ctrl.eval_freq_steps reads it; set exp_ctrl.eval_freq_steps=0 to turn it off)")
        load_rows("dataset.test_path", ds.test_path, columns=ds.columns, split=ds.test_split)
    _Fields(cfg).choice("dataset.chat_template", CHAT_TEMPLATE_SETTINGS)
    need(cfg.rollout.env.type != "none" or cfg.rollout.agent.type != "math-single-step" or bool(cfg.rollout.agent.reward_fn),
         "rollout.env.type=none: the math-single-step agent then needs rollout.agent.reward_fn to grade its answers")
    need(n_rows >= cfg.groups_per_step,
         f"dataset.path={cfg.dataset.path!r} has {n_rows} prompts, fewer than one batch (groups_per_step={cfg.groups_per_step})")


def check_critic_matches_actor(critic_path: str, actor_path: str) -> None:
    """adv_estimator=gae: the critic (empty path: the actor's weights) must be an HF model
    directory of the actor's architecture, compared on CRITIC_ARCH_KEYS of the two config.json."""
    actor = _hf_config("actor.path", actor_path)
    if not critic_path:
        return  # initialised from the actor's own directory
    critic = _hf_config("critic.path", critic_path)
    differ = [f"{key}={critic.get(key)!r} (actor: {actor.get(key)!r})"
              for key in CRITIC_ARCH_KEYS if critic.get(key) != actor.get(key)]
    _Fields.need(not differ,
                 f"critic.path={critic_path!r} has {', '.join(differ)} in its config.json, unlike actor.path="
                 f"{actor_path!r}: the critic is a value head on the actor's architecture, so it must share the "
                 f"actor's {', '.join(CRITIC_ARCH_KEYS)} (leave critic.path empty to start from the actor)")


def _hf_config(field: str, path: str) -> dict:
    """The config.json of the HF model directory `path`; a ConfigError naming `field` if unreadable."""
    file = os.path.join(path, "config.json")
    try:
        with open(file) as f:
            config = json.load(f)
    except OSError:
        raise ConfigError(f"{field}={path!r} is not an HF model directory (no config.json)") from None
    except ValueError as e:
        raise ConfigError(f"{field}={path!r}: {file} is not valid JSON ({e})") from None
    _Fields.need(isinstance(config, dict), f"{field}={path!r}: {file} is not a JSON object")
    return config


def load_rows(field: str, path: str, required=("solutions",), columns=None, split: str = "train"):
    """The prompts at `path` (JSONL, parquet or a datasets directory); a malformed row (file, row,
    column) or a missing `datasets` extra is a ConfigError naming `field`."""
    from realhf.impl.dataset.prompt_dataset import DatasetFormatError, load_prompts

    try:
        return load_prompts(path, required=required, columns=columns, split=split)
    except (DatasetFormatError, ImportError) as e:
        raise ConfigError(f"{field}: {e}") from None


def check_dataset_columns(c: DatasetColumnsConfig, prefix: str = "dataset.columns") -> None:
    """Only the id column may be left out (ids are then made from the file name and row); one
    column named for two facts would hand its values to both."""
    named = {name: getattr(c, name) for name in ("query_id", "prompt", "messages", "solutions", "task")}
    for name, column in named.items():
        _Fields.need(bool(column) or name == "query_id", f"{prefix}.{name} is empty: name the column that holds it")
    for a, b in itertools.combinations(named, 2):
        _Fields.need(not named[a] or named[a] != named[b],
                     f"{prefix}.{a} and {prefix}.{b} both name column {named[a]!r}; each needs its own")


def _max_positions(model_path: str) -> int:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get("max_position_embeddings", 0)
    except (OSError, ValueError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0
