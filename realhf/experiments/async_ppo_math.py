"""Asynchronous PPO on math prompts: the experiment config → one config per worker process.

`check_config` rejects anything that cannot run — naming the field — before a process starts;
`initial_setup` turns the experiment into the launcher's `WorkerSpec`s (DESIGN §2, §8):

    generation_server × gen.dp    gserver_manager × 1    rollout_worker × rollout.n_workers
    model_worker × train.dp       master_worker × 1 (its log is echoed to the console)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import List, Optional

from realhf.api.cli_args import (
    AsyncPPOMATHConfig,
    GenerationServerConfig,
    GserverManagerConfig,
    MasterWorkerConfig,
    ModelWorkerConfig,
    RolloutWorkerConfig,
    SCHEDULE_POLICIES,
    validate_generation_server_config,
)
from realhf.base.allocation_mode import AllocationMode
from realhf.impl.model import checkpoint
from realhf.scheduler.local import WorkerSpec

RECOVER_MODES = ("disabled", "auto", "resume")


class ConfigError(ValueError):
    """A config value that cannot run; the message names the field."""


@dataclass
class TrialPaths:
    log_dir: str  # one log per worker, metrics.jsonl
    run_dir: str  # param_realloc/ (published weights), checkpoints/, recover/

    @property
    def param_realloc(self) -> str:
        return os.path.join(self.run_dir, "param_realloc", "actor")

    @property
    def recover_checkpoint(self) -> str:
        return str(checkpoint.recover_dir(self.run_dir, "actor"))


def recover_info(cfg: AsyncPPOMATHConfig) -> Optional[dict]:
    """The recovery checkpoint this run resumes from, per `recover_mode` (None: start afresh).

    'resume' without a checkpoint is a ConfigError: the user asked to continue something that
    is not there (a wrong trial_name or fileroot, most likely)."""
    if cfg.recover_mode == "disabled":
        return None
    path = trial_paths(cfg).recover_checkpoint
    info = checkpoint.read_recover_info(path)
    if info is None and cfg.recover_mode == "resume":
        raise ConfigError(f"recover_mode=resume but there is no recovery checkpoint at {path} (experiment_name="
                          f"{cfg.experiment_name!r}, trial_name={cfg.trial_name!r}, cluster.fileroot="
                          f"{cfg.cluster.fileroot!r}); checkpoints are written every exp_ctrl.ckpt_freq_steps")
    return info


def trial_paths(cfg: AsyncPPOMATHConfig) -> TrialPaths:
    root = os.path.abspath(cfg.cluster.fileroot)
    return TrialPaths(
        log_dir=os.path.join(root, "logs", cfg.experiment_name, cfg.trial_name),
        run_dir=os.path.join(root, "runs", cfg.experiment_name, cfg.trial_name),
    )


def count_rows(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def check_config(cfg: AsyncPPOMATHConfig) -> AllocationMode:
    """Raise ConfigError naming the first field that cannot work; return the parsed allocation."""

    def need(ok: bool, message: str):
        if not ok:
            raise ConfigError(message)

    try:
        alloc = AllocationMode.parse(cfg.allocation_mode)
        alloc.validate(cfg.n_nodes, cfg.n_gpus_per_node)
    except ValueError as e:
        raise ConfigError(f"allocation_mode: {e}") from None
    need(cfg.n_nodes == 1, f"n_nodes={cfg.n_nodes}: the local launcher runs on one node (a Ray launcher is future work)")
    for name in ("group_size", "dataset.train_bs_n_seqs", "max_concurrent_rollouts", "rollout.n_workers",
                 "ppo.ppo_n_minibatches", "ppo.gen.max_new_tokens", "actor.n_threads"):
        value = _get(cfg, name)
        need(value > 0, f"{name} must be > 0, got {value}")
    need(cfg.max_head_offpolicyness >= 0, f"max_head_offpolicyness must be >= 0, got {cfg.max_head_offpolicyness}")
    need(cfg.new_tokens_per_chunk >= 0, f"new_tokens_per_chunk must be >= 0, got {cfg.new_tokens_per_chunk}")
    need(0.0 <= cfg.success_rate_lb <= 1.0 and 0.0 <= cfg.success_rate_ub <= 1.0,
         f"success_rate_lb={cfg.success_rate_lb} and success_rate_ub={cfg.success_rate_ub} must lie in [0, 1]")
    need(cfg.success_rate_lb <= cfg.success_rate_ub,
         f"success_rate_lb={cfg.success_rate_lb} > success_rate_ub={cfg.success_rate_ub}: every group would be dropped")
    need(cfg.schedule_policy in SCHEDULE_POLICIES,
         f"schedule_policy={cfg.schedule_policy!r}: choose one of {list(SCHEDULE_POLICIES)}")
    need(cfg.recover_mode in RECOVER_MODES, f"recover_mode={cfg.recover_mode!r}: choose one of {list(RECOVER_MODES)}")
    need(cfg.ppo.gen.temperature > 0,
         f"ppo.gen.temperature must be > 0 for RL (got {cfg.ppo.gen.temperature}): greedy rollouts give every "
         "answer of a group the same reward")
    need(cfg.ppo.eps_clip > 0, f"ppo.eps_clip must be > 0, got {cfg.ppo.eps_clip}")
    if cfg.ppo.behav_imp_weight_cap is not None:
        need(cfg.ppo.behav_imp_weight_cap >= 1, f"ppo.behav_imp_weight_cap must be >= 1, got {cfg.ppo.behav_imp_weight_cap}")

    for name in ("actor.path", "dataset.path"):
        path = _get(cfg, name)
        need(bool(path), f"{name} is empty")
        need(os.path.exists(path), f"{name}={path!r} does not exist (relative paths are from {os.getcwd()})")
    need(os.path.isfile(os.path.join(cfg.actor.path, "config.json")),
         f"actor.path={cfg.actor.path!r} is not an HF model directory (no config.json)")
    if cfg.ppo.kl_ctl > 0 and cfg.ref.path:
        need(os.path.isfile(os.path.join(cfg.ref.path, "config.json")),
             f"ref.path={cfg.ref.path!r} is not an HF model directory (no config.json)")
    if cfg.evaluation.n_prompts > 0:
        need(os.path.isfile(cfg.dataset.test_path),
             f"dataset.test_path={cfg.dataset.test_path!r} does not exist (set evaluation.n_prompts=0 to skip evaluation)")

    if cfg.wandb_project:
        import importlib.util

        need(importlib.util.find_spec("wandb") is not None,
             f"wandb_project={cfg.wandb_project!r} but wandb is not installed: pip install 'realhf[wandb]'")
        need(cfg.wandb_mode in ("offline", "online"), f"wandb_mode={cfg.wandb_mode!r}: choose 'offline' or 'online'")

    dp = alloc.train.dp
    B = cfg.dataset.train_bs_n_seqs
    need(B % dp == 0, f"dataset.train_bs_n_seqs={B} must be divisible by the trainer's DP size {dp} (allocation_mode)")
    need(cfg.rollout.n_workers >= dp,
         f"rollout.n_workers={cfg.rollout.n_workers} < trainer DP size {dp}: every DP rank needs a rollout worker")
    # Starvation: a DP rank waits for B/dp groups, all of which come from its own rollout
    # workers; if those may not keep that many in flight, the step never fills.
    share = B // dp
    per_worker = _per_worker_rollouts(cfg)
    from realhf.system.push_pull_stream import grouping

    for rank, senders in grouping(cfg.rollout.n_workers, dp).items():
        room = per_worker * len(senders)
        need(room >= share,
             f"max_concurrent_rollouts={cfg.max_concurrent_rollouts} over {cfg.rollout.n_workers} rollout workers lets "
             f"DP rank {rank} have only {room} groups in flight, but each train step needs {share} from it: "
             f"raise max_concurrent_rollouts to at least {share * math.ceil(cfg.rollout.n_workers / len(senders))}")
    check_value_ranges(cfg)
    # Parse every row now, so a malformed line fails here with file:line, not in a worker later.
    n_rows = len(_load_rows("dataset.path", cfg.dataset.path))
    if cfg.evaluation.n_prompts > 0:
        _load_rows("dataset.test_path", cfg.dataset.test_path)
    need(n_rows >= B, f"dataset.path={cfg.dataset.path!r} has {n_rows} prompts, fewer than one batch (train_bs_n_seqs={B})")
    return alloc


def _load_rows(field: str, path: str):
    from realhf.impl.dataset.prompt_dataset import DatasetFormatError, load_jsonl_prompts

    try:
        return load_jsonl_prompts(path)
    except DatasetFormatError as e:
        raise ConfigError(f"{field}: {e}") from None


_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def check_value_ranges(cfg: AsyncPPOMATHConfig) -> None:
    """Refusals of single values (and simple pairs) that would only fail inside a worker later;
    each message names the field. Called by `check_config`."""

    def need(ok: bool, message: str):
        if not ok:
            raise ConfigError(message)

    def at_least(name: str, low: float, strict: bool = False):
        value = _get(cfg, name)
        ok = value > low if strict else value >= low  # NaN fails both
        need(ok, f"{name} must be {'>' if strict else '>='} {low}, got {value}")

    def within(name: str, low: float, high: float):
        value = _get(cfg, name)
        need(low <= value <= high, f"{name} must lie in [{low}, {high}], got {value}")

    def choice(name: str, options):
        value = _get(cfg, name)
        need(value in options, f"{name}={value!r}: choose one of {list(options)}")

    for name in ("experiment_name", "trial_name"):
        value = _get(cfg, name)  # both become name-resolve key prefixes and directory names
        need(bool(value) and set(value) <= _NAME_CHARS and not value.startswith("."),
             f"{name}={value!r}: use letters, digits, '_', '-' and '.' only (not leading '.'), non-empty")
    need(bool(cfg.cluster.fileroot), "cluster.fileroot is empty")

    for name in ("exp_ctrl.benchmark_steps", "exp_ctrl.save_freq_steps", "exp_ctrl.ckpt_freq_steps",
                 "exp_ctrl.ckpt_freq_secs", "exp_ctrl.eval_freq_steps"):
        at_least(name, 0)
    if cfg.exp_ctrl.benchmark_steps == 0:
        at_least("exp_ctrl.total_train_epochs", 0, strict=True)
    for name in ("rollout.request_timeout", "stall_timeout"):
        at_least(name, 0, strict=True)

    gen = cfg.ppo.gen
    need(0 < gen.top_p <= 1, f"ppo.gen.top_p must lie in (0, 1], got {gen.top_p}")
    need(gen.top_k == -1 or gen.top_k >= 1, f"ppo.gen.top_k must be -1 (off) or >= 1, got {gen.top_k}")
    need(0 <= gen.min_new_tokens <= gen.max_new_tokens,
         f"ppo.gen.min_new_tokens must lie in [0, ppo.gen.max_new_tokens={gen.max_new_tokens}], got {gen.min_new_tokens}")
    need(all(t >= 0 for t in gen.stop_token_ids), f"ppo.gen.stop_token_ids must be token ids >= 0, got {gen.stop_token_ids}")
    at_least("gen_server.native.context_length", 0)
    context = cfg.gen_server.native.context_length or _max_positions(cfg.actor.path)
    if context:
        need(gen.max_new_tokens < context,
             f"ppo.gen.max_new_tokens={gen.max_new_tokens} leaves no room for a prompt in the generation servers' "
             f"context of {context} tokens (gen_server.native.context_length, 0: the model's max_position_embeddings)")

    ppo = cfg.ppo
    at_least("ppo.kl_ctl", 0)
    choice("ppo.kl_estimator", ("k1", "k2", "k3"))
    within("ppo.discount", 0.0, 1.0)
    within("ppo.gae_lambda", 0.0, 1.0)
    if ppo.eps_clip_high is not None:
        at_least("ppo.eps_clip_high", 0, strict=True)
    if ppo.c_clip is not None:
        at_least("ppo.c_clip", 1, strict=True)
    samples_per_rank = cfg.dataset.train_bs_n_seqs * cfg.group_size // max(1, AllocationMode.parse(cfg.allocation_mode).train.dp)
    need(ppo.ppo_n_minibatches <= samples_per_rank,
         f"ppo.ppo_n_minibatches={ppo.ppo_n_minibatches} exceeds the {samples_per_rank} samples a DP rank trains on per "
         "step (dataset.train_bs_n_seqs x group_size / DP): some minibatches would be empty")

    for role in ("actor", "ref"):
        choice(f"{role}.dtype", ("float32", "bfloat16"))
        choice(f"{role}.backend", ("torch",))
    opt = "actor.optimizer"
    choice(f"{opt}.type", ("adam",))
    choice(f"{opt}.lr_scheduler_type", ("constant", "cosine"))
    at_least(f"{opt}.lr", 0, strict=True)
    need(math.isfinite(cfg.actor.optimizer.lr), f"{opt}.lr must be finite, got {cfg.actor.optimizer.lr}")
    at_least(f"{opt}.weight_decay", 0)
    at_least(f"{opt}.eps", 0, strict=True)
    at_least(f"{opt}.gradient_clipping", 0)
    for name in ("beta1", "beta2"):
        value = getattr(cfg.actor.optimizer, name)
        need(0 <= value < 1, f"{opt}.{name} must lie in [0, 1), got {value}")
    within(f"{opt}.min_lr_ratio", 0.0, 1.0)
    within(f"{opt}.warmup_steps_proportion", 0.0, 1.0)

    at_least("evaluation.n_prompts", 0)
    if cfg.evaluation.n_prompts > 0:
        at_least("evaluation.max_new_tokens", 0, strict=True)
        at_least("evaluation.batch_size", 0, strict=True)
        at_least("evaluation.sampled_temperature", 0)


def _max_positions(model_path: str) -> int:
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get("max_position_embeddings", 0)
    except (OSError, ValueError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _per_worker_rollouts(cfg: AsyncPPOMATHConfig) -> int:
    return max(1, cfg.max_concurrent_rollouts // cfg.rollout.n_workers)


def initial_setup(cfg: AsyncPPOMATHConfig) -> List[WorkerSpec]:
    """The worker processes of one trial, with their configs (after `check_config`)."""
    alloc = check_config(cfg)
    paths = trial_paths(cfg)
    resume = recover_info(cfg) or {}
    host = cfg.cluster.bind_host
    n_rows = count_rows(cfg.dataset.path)
    steps_per_epoch = max(1, n_rows // cfg.dataset.train_bs_n_seqs)
    total_steps = cfg.exp_ctrl.benchmark_steps or steps_per_epoch * cfg.exp_ctrl.total_train_epochs

    gen_servers = []
    for i in range(alloc.gen.dp):
        g = GenerationServerConfig(
            backend=alloc.gen_engine, model_path=cfg.actor.path, host=host,
            native=dataclasses.replace(cfg.gen_server.native), sglang=dataclasses.replace(cfg.gen_server.sglang),
            tp_size=alloc.gen.tp, base_gpu_id=i * alloc.gen.tp * alloc.gen.pp, seed=cfg.seed,
            weights_root=paths.param_realloc,  # a restarted server loads the current weights
        )
        validate_generation_server_config(g)
        gen_servers.append(g)

    manager = GserverManagerConfig(
        host=host, schedule_policy=cfg.schedule_policy, max_concurrent_rollouts=cfg.max_concurrent_rollouts,
        train_batch_size=cfg.dataset.train_bs_n_seqs, max_head_offpolicyness=cfg.max_head_offpolicyness,
        n_servers=alloc.gen.dp, model_role="actor", fileroot=paths.run_dir,
        trained_groups_at_start=int(resume.get("training_samples", 0)),
    )
    agent = dataclasses.replace(cfg.rollout.agent, success_rate_lb=cfg.success_rate_lb,
                                success_rate_ub=cfg.success_rate_ub)
    rollout = RolloutWorkerConfig(
        dataset_path=cfg.dataset.path, tokenizer_path=cfg.actor.path, seed=cfg.seed, agent=agent,
        env=dataclasses.replace(cfg.rollout.env), gconfig=dataclasses.replace(cfg.ppo.gen),
        group_size=cfg.group_size, max_concurrent_rollouts=_per_worker_rollouts(cfg),
        new_tokens_per_chunk=cfg.new_tokens_per_chunk, n_pullers=alloc.train.dp,
        request_timeout=cfg.rollout.request_timeout,
    )
    model = ModelWorkerConfig(
        actor=cfg.actor, ref=cfg.ref, ppo=cfg.ppo, fileroot=paths.run_dir, bind_host=host,
        max_head_offpolicyness=cfg.max_head_offpolicyness, total_train_steps=total_steps, seed=cfg.seed,
        recover=bool(resume),
    )
    master = MasterWorkerConfig(
        n_model_workers=alloc.train.dp, train_batch_size=cfg.dataset.train_bs_n_seqs, group_size=cfg.group_size,
        dataset_size=n_rows, ppo=cfg.ppo, exp_ctrl=cfg.exp_ctrl, fileroot=os.path.abspath(cfg.cluster.fileroot),
        bind_host=host, tensorboard_path=cfg.tensorboard_path, wandb_project=cfg.wandb_project,
        wandb_mode=cfg.wandb_mode, stall_timeout=cfg.stall_timeout,
        expected_workers={"generation_server": alloc.gen.dp, "gserver_manager": 1, "model_worker": alloc.train.dp,
                          "rollout_worker": cfg.rollout.n_workers},
    )
    samplers = resume.get("rollout_samplers", {})
    rollouts = [dataclasses.replace(rollout, sampler_state=json.dumps(samplers[str(i)]) if str(i) in samplers else "")
                for i in range(cfg.rollout.n_workers)]
    specs = [
        WorkerSpec("generation_server", alloc.gen.dp, gen_servers),
        WorkerSpec("gserver_manager", 1, [manager]),
        WorkerSpec("model_worker", alloc.train.dp, [model] * alloc.train.dp),
        WorkerSpec("rollout_worker", cfg.rollout.n_workers, rollouts),
        WorkerSpec("master_worker", 1, [master], echo_log=True),
    ]
    policy = cfg.cluster.restart_policy
    for spec in specs:  # cluster.restart_policy.<worker type>
        spec.restart = bool(getattr(policy, spec.worker_type))
        spec.max_restarts, spec.restart_backoff = policy.max_restarts, policy.backoff
    return specs
