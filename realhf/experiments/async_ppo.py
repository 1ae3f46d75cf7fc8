"""Asynchronous PPO on the configured task (math prompts by default): the experiment config → one config per worker process.

`initial_setup` validates the root config (`realhf.experiments.validation`: a bad value fails here,
naming the field, before a process starts) and turns it into the launcher's `WorkerSpec`s
(docs/architecture.md §2, §8):

    generation_server × gen.dp    gserver_manager × 1    rollout_worker × rollout.n_workers (0: 2·train.dp)
    model_worker × train.dp·tp·pp      master_worker × 1 (its log is echoed to the console)
    evaluator × 1, only when exp_ctrl.eval_freq_steps > 0

Each worker config is derived here and nowhere else: a fact of the root tree reaches every
worker that needs it with the root's value. The GPU of every generation server and trainer rank,
and its memory share, come from one placement (`realhf.experiments.gpu_layout`, cluster.gpu_placement),
logged once per role.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from realhf.api.cli_args import AsyncPPOConfig
from realhf.api.worker_configs import (
    EvaluatorConfig,
    GenerationServerConfig,
    GserverManagerConfig,
    MasterWorkerConfig,
    ModelWorkerConfig,
    NodeWorkerConfig,
    RolloutWorkerConfig,
    from_root,
)
from realhf.base import logging, trial_files
from realhf.base.network import redact_url
from realhf.base.placement import Slot
from realhf.base.trial_files import TrialFiles
from realhf.experiments.external_servers import check_external_servers_answer
from realhf.experiments.file_validation import server_context
from realhf.experiments.gpu_layout import run_placement
from realhf.experiments.validate import validate_experiment
from realhf.experiments.validation import ConfigError, resumed_rollout_workers, rollouts_per_worker
from realhf.experiments.worker_validation import validate_worker_config
from realhf.impl.dataset.prompt_dataset import count_prompts
from realhf.scheduler.worker_spec import WorkerSpec
from realhf.system.stats.stats_logger import EVAL_METRICS_FILE

__all__ = ["ConfigError", "initial_setup", "resume_point", "resumed_from", "trial_files_of", "total_train_steps"]

logger = logging.getLogger("async_ppo")


def trial_files_of(cfg: AsyncPPOConfig) -> TrialFiles:
    return TrialFiles(cfg.cluster.fileroot, cfg.experiment_name, cfg.trial_name)


def total_train_steps(cfg: AsyncPPOConfig, n_rows: int) -> int:
    """exp_ctrl.benchmark_steps, or total_train_epochs passes over `n_rows` prompts."""
    steps_per_epoch = max(1, n_rows // cfg.groups_per_step)
    return cfg.exp_ctrl.benchmark_steps or steps_per_epoch * cfg.exp_ctrl.total_train_epochs


def resume_point(cfg: AsyncPPOConfig) -> Optional[Tuple[Path, Dict[str, Any]]]:
    """(path, info) of the recovery checkpoint this run resumes from, per `recover_mode`: the
    newest that verifies against its manifest (recover_checkpoint.choose); None: start afresh.

    'resume' without a checkpoint, and any mode but 'disabled' with only damaged ones, are
    ConfigErrors: the user asked to continue something that is not there (a wrong trial_name or
    fileroot, most likely), or that cannot be continued as it is."""
    if cfg.recover_mode == "disabled":
        return None
    # Here, not at the top: it imports torch and DCP (1.8 s on the launcher's critical path).
    from realhf.impl.model import recover_checkpoint as recover_ckpt

    run_dir = trial_files_of(cfg).run_dir
    try:
        point = recover_ckpt.choose(run_dir)
    except recover_ckpt.DamagedCheckpointError as e:
        raise ConfigError(f"recover_mode={cfg.recover_mode}: {e}") from None
    if point is None and cfg.recover_mode == "resume":
        raise ConfigError(
            f"recover_mode=resume but there is no recovery checkpoint at "
            f"{trial_files.recover_dir(run_dir)} (experiment_name={cfg.experiment_name!r}, trial_name="
            f"{cfg.trial_name!r}, cluster.fileroot={cfg.cluster.fileroot!r}); checkpoints are written "
            "every exp_ctrl.ckpt_freq_steps"
        )
    return point


def resumed_from(specs: List[WorkerSpec]) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(path, info) of the checkpoint `initial_setup` chose and handed the model workers; None
    when the run starts afresh. Read back from the specs: the choice is made (and verified) once."""
    model = next(s.configs[0] for s in specs if s.worker_type == "model_worker")
    if not model.recover_path:
        return None
    from realhf.impl.model import recover_checkpoint as recover_ckpt  # torch + DCP: only when resuming

    return model.recover_path, recover_ckpt.read_info(Path(model.recover_path))


def wandb_run_config(cfg: AsyncPPOConfig) -> dict:
    """The root config as the plain nested dict attached to the wandb run, the Redis password
    (cluster.name_resolve.redis_url) redacted: an online run uploads it."""
    out = dataclasses.asdict(cfg)
    resolve = out["cluster"]["name_resolve"]
    resolve["redis_url"] = redact_url(resolve["redis_url"])
    return out


def evaluator_config(cfg: AsyncPPOConfig, files: TrialFiles, resumed_version: int) -> EvaluatorConfig:
    return from_root(
        EvaluatorConfig,
        cfg,
        run_dir=files.run_dir,
        metrics_path=os.path.join(files.log_dir, EVAL_METRICS_FILE),
        wandb_run_name=f"{cfg.trial_name}-eval",
        resumed_version=resumed_version,
    )


def ray_gpus(slots: Sequence[Slot]) -> float:
    """The GPUs one worker of a role asks Ray for: its whole GPUs, or the fraction of its one GPU
    it may use (under Ray every slot of a role has the same: gpu_layout.run_placement). A float,
    never rounded: Ray packs two workers of 0.5 onto one GPU."""
    slot = slots[0]
    if not slot.gpus:
        return 0
    return slot.memory_fraction if slot.memory_fraction < 1 else float(len(slot.gpus))


def initial_setup(cfg: AsyncPPOConfig) -> List[WorkerSpec]:
    """The worker processes of one trial, with their configs; raises ConfigError first if the
    config cannot run."""
    alloc = validate_experiment(cfg)
    placement = run_placement(cfg, alloc)  # the GPUs of every server and trainer rank, decided once
    for line in placement.describe():
        logger.info(line)
    files = trial_files_of(cfg)
    point = resume_point(cfg)
    resume = point[1] if point else {}
    check_external_servers_answer(cfg.gen_server.urls, int(resume.get("version", 0)))
    n_rows = count_prompts(cfg.dataset.path, cfg.dataset.split, cfg.dataset.config_name)
    total_steps = total_train_steps(cfg, n_rows)

    gen_servers = [
        from_root(
            GenerationServerConfig,
            cfg,
            backend=alloc.gen_engine,
            tp_size=alloc.gen.tp,
            base_gpu_id=slot.gpus[0] if slot.gpus else 0,
            gpu_memory_fraction=slot.memory_fraction,
            # a restarted server loads the current weights from here
            weights_root=str(trial_files.published_weights_dir(files.run_dir, "actor")),
        )
        for slot in placement.servers
    ]
    manager = from_root(
        GserverManagerConfig,
        cfg,
        n_servers=alloc.gen.dp,
        pause_for_update=not (alloc.gen_engine == "native" and cfg.gen_server.native.keep_running_on_update),
        n_trainer_ranks=alloc.train.dp,
        model_role="actor",
        run_dir=files.run_dir,
        trained_groups_at_start=int(resume.get("training_samples", 0)),
    )
    n_rollout = resumed_rollout_workers(
        cfg, alloc.train.dp, int(resume.get("rollout_workers", 0)), str(point[0]) if point else ""
    )
    rollout = from_root(
        RolloutWorkerConfig,
        cfg,
        max_concurrent_rollouts=rollouts_per_worker(cfg, n_rollout),
        n_pullers=alloc.train.dp,
        context_tokens=server_context(cfg)[0],
    )
    model = from_root(
        ModelWorkerConfig,
        cfg,
        run_dir=files.run_dir,
        total_train_steps=total_steps,
        recover=bool(resume),
        recover_path=str(point[0]) if point else "",
        tp_size=alloc.train.tp,
        pp_size=alloc.train.pp,
        weight_sync_backend="nccl" if placement.mode == "separate" else "gloo",
        ranks_per_server=alloc.gen.tp,
        gen_backend=alloc.gen_engine,
        disk_every=cfg.exp_ctrl.eval_freq_steps,
    )
    n_node_workers = 1 if cfg.ppo.graph.own_process else 0
    master = from_root(
        MasterWorkerConfig,
        cfg,
        n_model_workers=alloc.train.world_size,
        n_node_workers=n_node_workers,
        trainer_tp=alloc.train.tp,
        trainer_pp=alloc.train.pp,
        total_train_steps=total_steps,
        log_dir=files.log_dir,
        expected_workers={
            "generation_server": 0 if cfg.gen_server.urls else alloc.gen.dp,
            "gserver_manager": 1,
            "model_worker": alloc.train.world_size,
            "rollout_worker": n_rollout,
        },
        run_config=wandb_run_config(cfg) if cfg.stats.wandb_project else {},
    )
    samplers = resume.get("rollout_samplers", {})
    # Every worker gets the whole pending list and runs those of its own shard first.
    pending = json.dumps(resume["rollout_pending"]) if resume.get("rollout_pending") else ""
    rollouts = [
        dataclasses.replace(
            rollout, sampler_state=json.dumps(samplers[str(i)]) if str(i) in samplers else "", pending=pending
        )
        for i in range(n_rollout)
    ]
    models = [
        dataclasses.replace(model, gpu=slot.gpus[0] if slot.gpus else 0, gpu_memory_fraction=slot.memory_fraction)
        for slot in placement.trainer
    ]
    # What each worker holds on a Ray cluster: its torch threads as CPUs, its GPUs (a fraction of
    # one where it shares it); the others (master, manager, rollout workers) mostly wait on
    # sockets and hold none.
    server_cpus = cfg.gen_server.native.n_threads if alloc.gen_engine == "native" else 1
    specs = [
        WorkerSpec(
            "generation_server",
            alloc.gen.dp,
            gen_servers,
            cpus=server_cpus,
            gpus=ray_gpus(placement.servers),
            placement_group=True,
        ),
        WorkerSpec("gserver_manager", 1, [manager]),
        WorkerSpec(
            "model_worker",
            alloc.train.world_size,
            models,
            cpus=cfg.actor.n_threads,
            gpus=ray_gpus(placement.trainer),
            placement_group=True,
        ),
        WorkerSpec("rollout_worker", n_rollout, rollouts),
        WorkerSpec("master_worker", 1, [master], echo_log=True),
    ]
    if n_node_workers:  # the step's nodes of ppo.graph.own_process, beside the trainer
        node = from_root(NodeWorkerConfig, cfg, stream_index=alloc.train.world_size)
        specs.append(WorkerSpec("node_worker", 1, [node], cpus=cfg.ref.n_threads))
        master.expected_workers["node_worker"] = 1
    if cfg.gen_server.urls:  # servers someone else runs: none launched, none stopped
        specs = [s for s in specs if s.worker_type != "generation_server"]
    if cfg.exp_ctrl.eval_freq_steps > 0:
        # No CPUs held on a Ray cluster: it runs niced, on what the trainer and servers leave idle.
        specs.append(WorkerSpec("evaluator", 1, [evaluator_config(cfg, files, int(resume.get("version", 0)))]))
        master.expected_workers["evaluator"] = 1
    policy = cfg.cluster.restart_policy
    for spec in specs:  # cluster.restart_policy.<worker type>
        spec.restart = bool(getattr(policy, spec.worker_type))
        spec.max_restarts, spec.restart_backoff = policy.max_restarts, policy.backoff
        spec.restart_window = policy.restart_window
        for c in spec.configs:
            validate_worker_config(c)  # what the workers will check at their entry, checked now
    return specs
