"""The rules for one worker's config, at every worker's entry (realhf.apps.remote) and for every
worker config the entry point derives (realhf.experiments): a config written by hand or by
another tool is held to the rules `realhf.experiments.validation` applies to the experiment's root."""

from __future__ import annotations

from typing import Any

from realhf.api import choices
from realhf.api.algorithms import adv_estimator
from realhf.api.worker_configs import (
    EvaluatorConfig,
    GenerationServerConfig,
    GserverManagerConfig,
    MasterWorkerConfig,
    ModelWorkerConfig,
    NodeWorkerConfig,
    RolloutWorkerConfig,
)
from realhf.experiments.file_validation import check_critic_matches_actor, check_dataset_columns
from realhf.experiments.validation import (
    _Fields,
    check_agent,
    check_device,
    check_env,
    check_exp_ctrl,
    check_generation,
    check_lora_reference,
    check_model,
    check_native_engine,
    check_ppo,
    check_rules,
    check_stats,
)


def _check_gpu_share(f: _Fields) -> None:
    share = f.value("gpu_memory_fraction")
    f.need(0 < share <= 1, f"{f.name('gpu_memory_fraction')} must lie in (0, 1], got {share}")


def _check_generation_server(c: GenerationServerConfig) -> None:
    f = _Fields(c, "generation_server")
    f.choice("backend", choices.GENERATION_BACKENDS)
    f.need(bool(c.model_path), "generation_server.model_path is empty; set it to an HF model directory")
    check_device(c.device, f.name("device"))
    check_native_engine(c.native, "generation_server.native")
    f.need(
        c.backend != "native" or c.tp_size == 1,
        f"generation_server.tp_size must be 1 with backend=native, got {c.tp_size}",
    )
    f.within("port", 0, 65535)
    f.at_least("base_gpu_id", 0)
    _check_gpu_share(f)
    for name in ("startup_timeout", "health_check_interval", "health_timeout", "keepalive_ttl"):
        f.at_least(name, 0, strict=True)
    f.at_least("max_health_failures", 1)


def _check_manager(c: GserverManagerConfig) -> None:
    f = _Fields(c, "gserver_manager")
    for name in ("n_servers", "n_trainer_ranks"):
        f.at_least(name, 0, strict=True)
    f.need(
        c.groups_per_step >= c.n_trainer_ranks,
        f"gserver_manager.groups_per_step={c.groups_per_step} < n_trainer_ranks={c.n_trainer_ranks}: "
        "every trainer DP rank takes at least one group per step",
    )
    f.need(0 < c.poll_interval <= 0.5, f"gserver_manager.poll_interval must be in (0, 0.5] s, got {c.poll_interval}")
    f.at_least("join_timeout", 0, strict=True)


def _check_rollout_worker(c: RolloutWorkerConfig) -> None:
    f = _Fields(c, "rollout_worker")
    for name in ("max_concurrent_rollouts", "n_pullers", "max_consecutive_failures"):
        f.at_least(name, 0, strict=True)
    check_dataset_columns(c.dataset_columns, "rollout_worker.dataset_columns")
    check_agent(c.agent)
    check_env(c.env)
    check_generation(c.gconfig)


def _check_model_worker(c: ModelWorkerConfig) -> None:
    f = _Fields(c)
    f.need(bool(c.actor.path), "actor.path is empty: set it to an HF model directory")
    check_model(c.actor, "actor")
    check_model(c.ref, "ref")
    check_model(c.critic, "critic")
    check_model(c.reward, "reward")
    check_lora_reference(c.actor, c.ref, c.ppo)
    check_ppo(c.ppo)
    check_device(c.device, f.name("device"))
    f.at_least("gpu", 0)
    f.at_least("tp_size", 1)
    f.at_least("pp_size", 1)
    _check_gpu_share(f)
    if adv_estimator(c.ppo.adv_estimator).needs_critic:
        check_critic_matches_actor(c.critic.path, c.actor.path)
    f.at_least("total_train_steps", 0)
    f.choice("weight_sync_backend", ("gloo", "nccl"))
    f.at_least("ranks_per_server", 1)
    f.choice("gen_backend", choices.GENERATION_BACKENDS)
    f.at_least("disk_every", 0)
    f.at_least("distributed_timeout", 0, strict=True)


def _check_node_worker(c: NodeWorkerConfig) -> None:
    f = _Fields(c, "node_worker")
    f.need(bool(c.ppo.graph.own_process), "node_worker: ppo.graph.own_process names no node to run")
    check_model(c.ref, "ref")
    check_ppo(c.ppo)
    check_device(c.device, f.name("device"))
    f.at_least("stream_index", 1)


def _check_master(c: MasterWorkerConfig) -> None:
    f = _Fields(c, "master_worker")
    f.at_least("n_model_workers", 1)
    f.need(
        c.n_node_workers == (1 if c.ppo.graph.own_process else 0),
        f"master_worker.n_node_workers={c.n_node_workers}: one node worker runs ppo.graph.own_process "
        f"({list(c.ppo.graph.own_process)}), none without it",
    )
    f.at_least("trainer_tp", 1)
    f.at_least("trainer_pp", 1)
    split = max(c.trainer_tp, 1) * max(c.trainer_pp, 1)
    f.need(
        c.n_model_workers % split == 0,
        f"master_worker.n_model_workers={c.n_model_workers} is not a multiple of trainer_tp x trainer_pp={split}",
    )
    dp = c.n_model_workers // split
    f.need(
        c.groups_per_step >= dp,
        f"groups_per_step ({c.groups_per_step}) must be >= the trainer's DP ranks ({dp}): "
        "every DP rank trains at least one group per step",
    )
    f.at_least("total_train_steps", 0, strict=True)
    check_exp_ctrl(c.exp_ctrl)
    check_ppo(c.ppo)
    check_stats(c.stats, "master_worker.stats")


def _check_evaluator(c: EvaluatorConfig) -> None:
    f = _Fields(c, "evaluator")
    for name in ("eval_freq_steps", "n_prompts", "samples", "n_threads", "max_new_tokens", "batch_size"):
        f.at_least(name, 1)
    f.at_least("temperature", 0)
    f.within("nice", 0, 19)
    f.at_least("poll_interval", 0, strict=True)
    f.at_least("answer_timeout", 0, strict=True)
    f.need(bool(c.run_dir) and bool(c.metrics_path), "evaluator.run_dir and evaluator.metrics_path must be set")
    check_native_engine(c.native, "evaluator.native")
    check_dataset_columns(c.columns, "evaluator.columns")
    check_device(c.device, "evaluator.device")


# (the checks, the prefix naming the worker's fields in an error)
_WORKER_CHECKS = {
    GenerationServerConfig: (_check_generation_server, "generation_server"),
    GserverManagerConfig: (_check_manager, "gserver_manager"),
    RolloutWorkerConfig: (_check_rollout_worker, "rollout_worker"),
    ModelWorkerConfig: (_check_model_worker, ""),
    MasterWorkerConfig: (_check_master, "master_worker"),
    NodeWorkerConfig: (_check_node_worker, "node_worker"),
    EvaluatorConfig: (_check_evaluator, "evaluator"),
}


def validate_worker_config(cfg: Any) -> None:
    """The rules for one worker's config: the rules its root facts declare (a `same_as` field
    carries its root field's; its sections are checked by their own check_*), then the worker's
    own. A no-op for config classes this module does not know, e.g. a user's own worker."""
    entry = _WORKER_CHECKS.get(type(cfg))
    if entry is not None:
        check, prefix = entry
        check_rules(cfg, prefix, deep=False)
        check(cfg)
