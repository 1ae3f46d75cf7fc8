"""ModelWorker: one data-parallel rank of the trainer (torch backend), driven by the master.

    configure: trajectory puller (this DP head's StreamDataset) → torch.distributed rendezvous →
               load the actor (and the reference when kl_ctl > 0) → optimizer → connect to the
               master's request socket
    loop:      poll one request → run its handler → reply (errors go back as RemoteError)

Handlers (DESIGN §6): `initialize`, `fetch` (report buffered groups / take this step's share,
applying the staleness guard), `inference` (proximal or reference log-probs of the taken batch),
`train_step` (ppo_n_minibatches optimizer steps, version + 1, publish the weights), `save`,
`checkpoint`, `ping`. The work itself lives in realhf.impl.model.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from realhf.api.cli_args import ModelTrainEvalConfig, ModelWorkerConfig
from realhf.api.trajectory import Trajectory
from realhf.base import name_resolve, names
from realhf.base.network import host_for_peers, split_host_port
from realhf.impl.model import actor, checkpoint
from realhf.impl.model.batching import TrainBatch, batch_summary, pack_trajectories
from realhf.impl.model.buffer import TrajectoryBuffer
from realhf.impl.model.optim import make_optimizer
from realhf.system.push_pull_stream import NameResolvingZmqPuller
from realhf.system.request_reply_stream import WorkerStream
from realhf.system.stream_dataset import StreamDataset
from realhf.system.worker_base import Worker

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def check_model_worker_config(cfg: ModelWorkerConfig) -> None:
    """Raise ValueError naming the field for values the torch backend cannot run."""
    for role, m in (("actor", cfg.actor), ("ref", cfg.ref)):
        if m.backend != "torch":
            raise ValueError(f"{role}.backend must be 'torch', got {m.backend!r}")
        if m.dtype not in _DTYPES:
            raise ValueError(f"{role}.dtype must be one of {sorted(_DTYPES)}, got {m.dtype!r}")
        if m.n_threads < 1:
            raise ValueError(f"{role}.n_threads must be >= 1, got {m.n_threads}")
    if not cfg.actor.path:
        raise ValueError("actor.path is empty: set it to an HF model directory")
    if cfg.ppo.ppo_n_minibatches < 1:
        raise ValueError(f"ppo.ppo_n_minibatches must be >= 1, got {cfg.ppo.ppo_n_minibatches}")
    if cfg.ppo.kl_estimator not in ("k1", "k2", "k3"):
        raise ValueError(f"ppo.kl_estimator must be 'k1', 'k2' or 'k3', got {cfg.ppo.kl_estimator!r}")
    ppo = cfg.ppo
    if not ppo.eps_clip > 0 or (ppo.eps_clip_high is not None and not ppo.eps_clip_high > 0):
        raise ValueError(f"ppo.eps_clip and ppo.eps_clip_high must be > 0, got {ppo.eps_clip}, {ppo.eps_clip_high}")
    if ppo.c_clip is not None and not ppo.c_clip > 1:
        raise ValueError(f"ppo.c_clip (dual clip) must be > 1 or null, got {ppo.c_clip}")
    if ppo.behav_imp_weight_cap is not None and not ppo.behav_imp_weight_cap >= 1:
        raise ValueError(f"ppo.behav_imp_weight_cap must be >= 1 or null, got {ppo.behav_imp_weight_cap}")
    if cfg.max_head_offpolicyness < 0:
        raise ValueError(f"max_head_offpolicyness must be >= 0, got {cfg.max_head_offpolicyness}")


def load_causal_lm(m: ModelTrainEvalConfig, path: Optional[str] = None) -> torch.nn.Module:
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.utils.logging.disable_progress_bar()
    path = path or m.path
    # safetensors only: a pytorch_model.bin is a pickle, and loading one can run code.
    if os.path.isdir(path) and not any(f.endswith(".safetensors") for f in os.listdir(path)):
        raise ValueError(f"model path {path!r} has no *.safetensors file; realhf loads only safetensors "
                         "checkpoints (re-save it with save_pretrained(..., safe_serialization=True))")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=_DTYPES[m.dtype], use_safetensors=True)
    if m.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


class ModelWorker(Worker):
    config_cls = ModelWorkerConfig

    # ---- set-up -----------------------------------------------------------------------------
    def _configure(self) -> None:
        cfg: ModelWorkerConfig = self.config
        self._stream: Optional[WorkerStream] = None
        self._dataset: Optional[StreamDataset] = None
        self._dist_initialized = False
        check_model_worker_config(cfg)
        torch.set_num_threads(cfg.actor.n_threads)
        torch.manual_seed(cfg.seed)
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        self.dp_rank, self.dp_size = self.ctx.worker_index, self.ctx.worker_count
        self.version = 0
        self._batch: Optional[TrainBatch] = None

        # Listen for trajectories first, so rollout workers can start pushing while we load.
        puller = NameResolvingZmqPuller(exp, trial, self.dp_rank, host=cfg.bind_host)
        self._dataset = StreamDataset(puller, maxsize=cfg.stream_queue_size, parse=Trajectory.from_msg,
                                      name=f"dp{self.dp_rank}-stream")
        self._buffer = TrajectoryBuffer(cfg.max_head_offpolicyness)
        self._init_distributed()

        self._recover_path = checkpoint.recover_dir(cfg.fileroot, "actor")
        recovering = cfg.recover and checkpoint.has_recover_state(self._recover_path)
        self.actor = load_causal_lm(cfg.actor, str(self._recover_path) if recovering else None)
        self.ref = None
        if cfg.ppo.kl_ctl > 0:
            self.ref = load_causal_lm(cfg.ref, cfg.ref.path or cfg.actor.path).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        horizon = cfg.total_train_steps * cfg.ppo.ppo_n_minibatches
        self.optimizer, self.lr_scheduler = make_optimizer(self.actor, cfg.actor.optimizer, horizon)
        if recovering:
            info = checkpoint.load_recover_state(self._recover_path, self.optimizer, self.lr_scheduler)
            self.version = int(info["version"])
            self.logger.info(f"recovered version {self.version} from {self._recover_path}")
        self.pad_id = int(getattr(self.actor.config, "pad_token_id", None) or 0)
        # actor_inf may skip the first minibatch (its train forward, before any optimizer step,
        # gives the same log-probs) unless dropout makes train and eval forwards differ, or the
        # advantages need the proximal log-probs before training (a KL reward through GAE).
        self._can_defer_prox = not actor.has_dropout(self.actor) and (cfg.ppo.group_adv_norm or cfg.ppo.kl_ctl == 0)
        self._prox_deferred = False
        n_params = sum(p.numel() for p in self.actor.parameters())
        self.logger.info(f"dp rank {self.dp_rank}/{self.dp_size}: actor {cfg.actor.path} ({n_params / 1e6:.2f}M params, "
                         f"{cfg.actor.dtype}), ref {'loaded' if self.ref is not None else 'off'}, "
                         f"eta {cfg.max_head_offpolicyness}, puller {puller.address}")

        self._handlers: Dict[str, Callable[[Any], Any]] = {
            "initialize": self._initialize, "fetch": self._fetch, "inference": self._inference,
            "train_step": self._train_step, "save": self._save, "checkpoint": self._checkpoint,
            "ping": self._ping,
        }  # fmt: skip
        self._stream = WorkerStream(exp, trial, self.dp_rank, discovery_timeout=cfg.master_discovery_timeout)

    def _init_distributed(self) -> None:
        """Rank 0 binds the rendezvous store on a free port and publishes it in name resolve."""
        if self.dp_size == 1:
            return
        cfg = self.config
        key = names.distributed_master(self.ctx.experiment_name, self.ctx.trial_name)
        timeout = datetime.timedelta(seconds=cfg.distributed_timeout)
        if self.dp_rank == 0:
            # TCPStore given a host still listens on every interface; handing it a socket we
            # bound ourselves keeps the rendezvous on bind_host (loopback by default).
            self._store_socket = socket.create_server((cfg.bind_host, 0))
            store = dist.TCPStore(cfg.bind_host, self._store_socket.getsockname()[1], self.dp_size, is_master=True,
                                  timeout=timeout, wait_for_workers=False, master_listen_fd=self._store_socket.fileno())
            name_resolve.add(key, f"{host_for_peers(cfg.bind_host)}:{store.port}", replace=True)
        else:
            host, port = split_host_port(name_resolve.wait(key, timeout=cfg.distributed_timeout))
            store = dist.TCPStore(host, port, self.dp_size, is_master=False, timeout=timeout)
        t0 = time.monotonic()
        dist.init_process_group("gloo", store=store, rank=self.dp_rank, world_size=self.dp_size, timeout=timeout)
        self._dist_initialized = True
        self.logger.info(f"torch.distributed (gloo) ready: rank {self.dp_rank}/{self.dp_size} in {time.monotonic() - t0:.1f}s")

    # ---- the loop ---------------------------------------------------------------------------
    def _poll(self) -> bool:
        request = self._stream.poll(timeout=0.05)
        if request is None:
            return False
        handler = self._handlers.get(request.handle_name)
        try:
            if handler is None:
                raise ValueError(f"unknown handler {request.handle_name!r}; known: {sorted(self._handlers)}")
            reply = handler(request.data if request.data is not None else {})
        except Exception as e:
            self.logger.exception(f"handler {request.handle_name!r} failed: {e}")
            self._stream.reply_error(request, e)
        else:
            self._stream.reply(request, reply)
        return True

    def _exit_hook(self) -> None:
        if getattr(self, "_stream", None) is not None:
            self._stream.close()
        if getattr(self, "_dataset", None) is not None:
            self._dataset.close()
        if getattr(self, "_dist_initialized", False):
            dist.destroy_process_group()
        if getattr(self, "_store_socket", None) is not None:
            self._store_socket.close()

    # ---- handlers ---------------------------------------------------------------------------
    def _publish_version(self) -> None:
        if self.dp_rank == 0:
            key = names.model_version(self.ctx.experiment_name, self.ctx.trial_name, "actor")
            # Kept after exit: the last published version is part of the trial's record.
            name_resolve.add(key, str(self.version), replace=True, delete_on_exit=False)

    def _initialize(self, data: Any) -> Dict[str, Any]:
        if self.version > 0 and self.dp_rank == 0:  # recovered: servers must load these weights
            checkpoint.publish_weights(self.actor, self.config.fileroot, "actor", self.version,
                                       self.config.actor.path, self.config.keep_last_versions)
        self._publish_version()
        return {"dp_rank": self.dp_rank, "dp_size": self.dp_size, "version": self.version,
                "n_params": sum(p.numel() for p in self.actor.parameters())}

    def _pull_into_buffer(self) -> None:
        for traj in self._dataset.get_available():  # parsed by the dataset's pull thread
            self._buffer.add([traj])
        dropped = self._buffer.drop_stale(self.version)
        if dropped:
            oldest = min(g.version_start for g in dropped)
            self.logger.warning(
                f"dropped {len(dropped)} stale groups (version_start >= {oldest}, need >= "
                f"{self.version - self._buffer.eta} at version {self.version}); {self._buffer.n_stale_dropped} in total")

    def _fetch(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{take: n}`: move the n oldest trainable groups into this step's batch (n = 0: only report)."""
        self._pull_into_buffer()
        reply = {"dp_rank": self.dp_rank, "version": self.version, "buffered": len(self._buffer),
                 "stale_dropped": self._buffer.n_stale_dropped, "received": self._dataset.n_pulled,
                 "invalid": self._dataset.n_invalid}
        take = int(data.get("take", 0))
        if take > 0:
            groups = self._buffer.take(take, self.version)
            self._batch = pack_trajectories(groups, self.pad_id)
            summary = batch_summary(groups, self.version)
            reply["batch"] = summary
            reply["buffered"] = len(self._buffer)
            self.logger.info(f"version {self.version}: took {take} groups ({summary['n_samples']} samples, "
                             f"{summary['gen_tokens']} trained tokens, head staleness max "
                             f"{max(summary['head_offpolicyness'])}); {len(self._buffer)} still buffered")
        return reply

    def _need_batch(self, what: str) -> TrainBatch:
        if self._batch is None:
            raise RuntimeError(f"{what}: no batch taken; call fetch with take > 0 first")
        return self._batch

    def _inference(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{model: actor|ref}`: log-probs of the batch; actor → proximal, ref → reference."""
        batch = self._need_batch("inference")
        role = data.get("model", "actor")
        if role not in ("actor", "ref"):
            raise ValueError(f"inference: model must be 'actor' or 'ref', got {role!r}")
        model = self.actor if role == "actor" else self.ref
        if model is None:
            raise ValueError("inference on 'ref' but no reference model is loaded (ppo.kl_ctl is 0)")
        t0 = time.monotonic()
        rows = None
        if role == "actor":
            self._prox_deferred = self._can_defer_prox
        if role == "actor" and self._prox_deferred:  # the first minibatch's train forward computes its own
            first = set(actor.first_minibatch_rows(batch.n_seqs, self.config.ppo.ppo_n_minibatches).tolist())
            rows = torch.tensor([r for r in range(batch.n_seqs) if r not in first], dtype=torch.long)
        logp = actor.inference_logprobs(model, batch, self.config.ppo.gen.temperature,
                                        micro_batch_tokens=self.config.ppo.micro_batch_tokens, rows=rows)
        mask = batch.loss_mask.clone()
        if rows is not None:
            mask[list(first)] = False
        if role == "actor":
            batch.prox_logprobs = logp
        else:
            batch.ref_logprobs = logp
        n = max(int(mask.sum()), 1)
        return {"model": role, "n_tokens": int(mask.sum()), "time_s": time.monotonic() - t0,
                "logprob_mean": float(logp[mask].sum()) / n,
                # Sampler vs trainer agreement: large only when the weights moved (staleness).
                "behav_abs_diff": float((logp - batch.behav_logprobs)[mask].abs().sum()) / n}

    def _train_step(self, data: Dict[str, Any]) -> Dict[str, Any]:
        batch = self._need_batch("train_step")
        cfg = self.config
        t0 = time.monotonic()
        stats = actor.ppo_train_step(self.actor, self.optimizer, self.lr_scheduler, batch, cfg.ppo,
                                     cfg.actor.optimizer.gradient_clipping,
                                     prox_from_first_forward=getattr(self, "_prox_deferred", False))
        self._prox_deferred = False
        train_s = time.monotonic() - t0
        self.version += 1
        self._batch = None
        published = ""
        if self.dp_rank == 0:
            path = checkpoint.publish_weights(self.actor, cfg.fileroot, "actor", self.version, cfg.actor.path,
                                              cfg.keep_last_versions)
            published = str(path)
            self._publish_version()  # after the rename: a reader never sees a version without its weights
        self.logger.info(f"version {self.version}: loss {stats['loss']:.4f} grad_norm {stats['grad_norm']:.3f} "
                         f"clip {stats['clip_fraction']:.3f} {int(stats['n_tokens'])} tokens, train {train_s:.2f}s, "
                         f"publish {time.monotonic() - t0 - train_s:.2f}s")
        return {"version": self.version, "stats": stats, "published": published, "train_time_s": train_s,
                "publish_time_s": time.monotonic() - t0 - train_s}

    def _save(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """An HF checkpoint at `path` (default `<fileroot>/checkpoints/actor/version<v>`; the
        experiment's fileroot is already per trial)."""
        path = data.get("path") or os.path.join(self.config.fileroot, "checkpoints", "actor", f"version{self.version}")
        if self.dp_rank == 0:  # every rank holds the same weights
            checkpoint.save_hf_dir(self.actor, Path(path), self.config.actor.path)
        return {"path": str(path), "version": self.version}

    def _checkpoint(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """Recovery state: weights + optimizer + LR schedule + RNG + version, and the master's
        `extra` counters in the same atomic write (rank 0; ranks are replicas)."""
        if self.dp_rank == 0:
            checkpoint.save_recover_state(self._recover_path, self.actor, self.optimizer, self.lr_scheduler,
                                          self.version, self.config.actor.path, extra=data.get("extra"))
        return {"path": str(self._recover_path), "version": self.version}

    def _ping(self, data: Any) -> Dict[str, Any]:
        return {"dp_rank": self.dp_rank, "version": self.version, "buffered": len(self._buffer)}
