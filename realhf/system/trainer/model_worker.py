"""ModelWorker: one data-parallel rank of the trainer (torch backend), driven by the master.

    configure: trajectory puller (this DP head's StreamDataset) → torch.distributed process
               group (gloo on the CPU, NCCL on GPUs: realhf.base.device) → the engines (FSDP2
               actor, frozen reference when kl_ctl > 0, critic when adv_estimator=gae; resumed
               from the recovery checkpoint when asked) → connect to the master's request socket
    loop:      poll one request → run its handler → reply (errors go back as RemoteError)

Handlers (docs/architecture.md §6): `initialize`, `fetch` (report buffered groups / take this step's share,
applying the staleness guard; with `completions: n`, also n of the taken samples decoded for the
master to log, realhf.system.stats.completion_log), `balance` (move the taken groups between ranks as the master's
token-balancing plan says, then build the step's batch), `step_node` (`node`: one node of the
step's graph, realhf.system.trainer.ppo_step — proximal, reference or critic inference, the
advantages, the critic's or the actor's update; after the actor's, version + 1 and the weights
published), `save`, `checkpoint`, `catch_up` (the current version to a server that joined while the
trainer waits for data), `ping`. Every handler past `fetch` is collective: all DP ranks get the same request, and a
collective that does not complete within `collective_timeout` fails the handler naming this
rank, the engine, the call and the step (realhf.base.collectives); the worker then exits, since
its process group can no longer be trusted. The worker
owns the data (stream, buffer, staleness guard), the weight version and its publishing; the
training work lives in realhf.system.trainer.ppo_actor.
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

from realhf.api.train_batch import REQUIRED_FIELDS, TrainBatch
from realhf.api.trajectory import Trajectory
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.base import collectives, name_resolve, names, trial_files
from realhf.base.device import bind_device, cap_memory, dist_backend, pick_device, why_device
from realhf.base.network import bind_gloo_to, host_for_peers, split_host_port
from realhf.base.trainer_layout import TrainerLayout
from realhf.impl.model import checkpoint, recover_checkpoint
from realhf.impl.model.batching import batch_summary, pack_trajectories
from realhf.system.stats import completion_log
from realhf.system.streams.push_pull_stream import NameResolvingZmqPuller
from realhf.system.streams.request_reply_stream import WorkerStream
from realhf.system.trainer import group_exchange
from realhf.system.trainer.buffer import TrajectoryBuffer
from realhf.system.trainer.ppo_actor import PPOActor, PPOCritic, build_engines
from realhf.system.trainer.ppo_step import build_graph, trainer_models
from realhf.system.trainer.step_ops import StepContext, run_node
from realhf.system.trainer.stream_dataset import StreamDataset
from realhf.system.trainer.weight_broadcast import WeightBroadcaster
from realhf.system.worker_base import Worker


class ModelWorker(Worker):
    config_cls = ModelWorkerConfig
    warm_modules = ("transformers.masking_utils", "transformers.modeling_layers")  # in loading its HF model

    # ---- set-up -----------------------------------------------------------------------------
    def _configure(self) -> None:
        cfg: ModelWorkerConfig = self.config
        self._stream: Optional[WorkerStream] = None
        self._dataset: Optional[StreamDataset] = None
        self._dist_initialized = False
        torch.set_num_threads(cfg.actor.n_threads)
        torch.manual_seed(cfg.seed)
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        # Tensor and pipeline parallelism: the ranks of one replica split the layers and stages;
        # its head receives the trajectories and hands each step's batch to the others
        # (realhf.base.trainer_layout).
        self.rank, self.world_size = self.ctx.worker_index, self.ctx.worker_count
        self.layout = TrainerLayout.of(self.world_size, cfg.tp_size, cfg.pp_size)
        self.tp_size, self.pp_size, self.dp_size = self.layout.tp, self.layout.pp, self.layout.dp
        self.dp_rank, self.tp_rank, self.pp_rank = self.layout.coords(self.rank)
        self.head_rank = self.layout.head(self.dp_rank)
        self.is_head = self.rank == self.head_rank
        self.version = 0
        self._taken: List[Trajectory] = []  # this rank's share of the step, before balancing
        self._batch: Optional[TrainBatch] = None
        self._tokenizer: Any = None  # loaded when the master first asks for completions (stats.log_completions)

        # Listen for trajectories first, so rollout workers can start pushing while we load.
        puller = None
        if self.is_head:
            puller = NameResolvingZmqPuller(
                exp,
                trial,
                self.dp_rank,
                host=cfg.bind_host,
                secret=self.ctx.secret,
                max_message_bytes=cfg.max_message_bytes,
            )
            self._dataset = StreamDataset(
                puller, maxsize=cfg.stream_queue_size, parse=Trajectory.from_msg, name=f"dp{self.dp_rank}-stream"
            )
        self._buffer = TrajectoryBuffer(cfg.max_head_offpolicyness)
        # The placement's GPU (realhf.base.placement), unless the launcher gave the process its
        # own GPU (Ray): then it is device 0. A GPU shared with a generation server caps our memory.
        local_rank = 0 if self.ctx.gpus_assigned else cfg.gpu
        t_device = time.monotonic()
        self.device = pick_device(cfg.device, local_rank)
        bind_device(self.device)
        cap_memory(self.device, cfg.gpu_memory_fraction)
        self._init_distributed()

        t0 = time.monotonic()
        device_s = t0 - t_device
        self.graph = build_graph(cfg.ppo)
        roles = trainer_models(self.graph, cfg.ppo.graph.own_process)  # a placed reference lives on the node worker
        self.engines = build_engines(cfg, local_rank, self._io_group, roles=roles)
        self.actor = PPOActor(self.engines["actor"], cfg.ppo)
        self.critic = PPOCritic(self.engines["critic"], cfg.ppo, self.actor.kl) if "critic" in self.engines else None
        self._trained = {role: e for role, e in self.engines.items() if role != "ref"}
        self._recover_path = trial_files.recover_dir(cfg.run_dir)
        self._resume: Dict[str, Any] = {}  # the checkpoint's prompt accounting, for the master
        self._dropped_qids: List[str] = []  # stale-dropped since the last fetch reply
        self._broadcaster: Optional[WeightBroadcaster] = None  # weight_sync=distributed, rank 0
        self._last_broadcast = None
        self._on_disk = -1  # the newest version written under published_weights/ (the same on every rank)
        # The launcher chose (and verified) the checkpoint: ranks deciding on their own could differ.
        resume_from = Path(cfg.recover_path) if cfg.recover_path else self._recover_path
        if cfg.recover and (cfg.recover_path or recover_checkpoint.read_info(resume_from) is not None):
            info = recover_checkpoint.load(resume_from, self._trained, self.rank, self.device)
            self.version = int(info["version"])
            self.actor.load_state_dict(info.get("actor_state", {}))  # the adaptive KL coefficient
            self._resume = {k: info[k] for k in ("rollout_pending", "rollout_samplers") if k in info}
            self.logger.info(f"recovered version {self.version} from {resume_from}")
        sizes = ", ".join(f"{role} {e.n_params / 1e6:.2f}M" for role, e in self.engines.items())
        if cfg.actor.lora.r > 0:
            sizes += (
                f" params (LoRA r={cfg.actor.lora.r}: {self.engines['actor'].n_trainable / 1e6:.3f}M trained"
                f"{'; ref: the actor with its adapters off' if 'ref' in self.engines else ''})"
            )
        else:
            sizes += " params"
        share = (
            f" ({cfg.gpu_memory_fraction:g} of its memory)"
            if self.device.type != "cpu" and cfg.gpu_memory_fraction < 1
            else ""
        )
        layout = "FSDP2-sharded" if self.engines["actor"].sharded else "unsharded"
        if self.tp_size > 1:
            layout += f", layers split over {self.tp_size} tensor-parallel ranks"
        if self.pp_size > 1:
            layout += f", pipeline stage {self.pp_rank} of {self.pp_size}"
        self.logger.info(
            f"{self._where()} on {self.device}{share} ({why_device(cfg.device, self.device)}): {sizes} "
            f"({cfg.actor.dtype}, {layout}), device and process groups {device_s:.1f}s, loaded in "
            f"{time.monotonic() - t0:.1f}s; eta {cfg.max_head_offpolicyness}, "
            + (f"puller {puller.address}" if puller is not None else f"data from its head (rank {self.head_rank})")
        )

        self._handlers: Dict[str, Callable[[Any], Any]] = {
            "initialize": self._initialize, "fetch": self._fetch, "balance": self._balance,
            "step_node": self._step_node, "get_tensors": self._get_tensors, "set_tensors": self._set_tensors,
            "save": self._save, "checkpoint": self._checkpoint, "catch_up": self._catch_up, "ping": self._ping,
        }  # fmt: skip
        self._stream = WorkerStream(
            exp,
            trial,
            self.rank,
            discovery_timeout=cfg.master_discovery_timeout,
            secret=self.ctx.secret,
            max_message_bytes=cfg.max_message_bytes,
        )

    def _init_distributed(self) -> None:
        """The process group every engine shards over (its timeout: `collective_timeout`), and two
        gloo groups: `_cpu_group` (the same timeout) moves groups between ranks, `_io_group`
        (`distributed_timeout`) waits for another rank's disk writes. Rank 0 binds the rendezvous
        store on a free port and publishes it in name resolve; a single rank uses an in-process store."""
        cfg = self.config
        backend = dist_backend(self.device)
        timeout = datetime.timedelta(seconds=cfg.distributed_timeout)
        bind_gloo_to(cfg.bind_host)  # gloo's own listeners too, not only the TCPStore
        self._cpu_group = self._io_group = self._replica_group = None
        collective = datetime.timedelta(seconds=cfg.collective_timeout)
        if backend == "nccl":
            # NCCL's watchdog aborts a rank whose collective times out, before Python could name
            # the call: its flight recorder then dumps the last collectives of every rank (op,
            # sizes, sequence number) next to the worker logs. Never run here (no GPU in CI).
            os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
            os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
            os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(self.ctx.log_dir or ".", "nccl_trace_rank_"))
        if self.world_size == 1:
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=collective)
            self._dist_initialized = True
            return
        key = names.distributed_master(self.ctx.experiment_name, self.ctx.trial_name)
        if self.rank == 0:
            # TCPStore given a host still listens on every interface; handing it a socket we
            # bound ourselves keeps the rendezvous on bind_host (loopback by default).
            self._store_socket = socket.create_server((cfg.bind_host, 0))
            store = dist.TCPStore(
                cfg.bind_host,
                self._store_socket.getsockname()[1],
                self.world_size,
                is_master=True,
                timeout=timeout,
                wait_for_workers=False,
                master_listen_fd=self._store_socket.fileno(),
            )
            name_resolve.add(key, f"{host_for_peers(cfg.bind_host)}:{store.port}", replace=True)
        else:
            host, port = split_host_port(name_resolve.wait(key, timeout=cfg.distributed_timeout))
            store = dist.TCPStore(host, port, self.world_size, is_master=False, timeout=timeout)
        t0 = time.monotonic()
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=collective)
        self._dist_initialized = True
        split = self.layout.world > self.dp_size
        # Groups move between the DP heads; a head hands its batch to its replica's other ranks.
        self._cpu_group = collectives.new_gloo_group(cfg.collective_timeout, self.layout.heads() if split else None)
        for d in range(self.dp_size if split else 0):  # every rank makes every new_group call, in order
            group = collectives.new_gloo_group(cfg.collective_timeout, self.layout.replica(d))
            if d == self.dp_rank:
                self._replica_group = group
        self._io_group = collectives.new_gloo_group(cfg.distributed_timeout)
        self.logger.info(
            f"torch.distributed ({backend}) ready: rank {self.rank}/{self.world_size} "
            f"in {time.monotonic() - t0:.1f}s; collectives time out after {cfg.collective_timeout:g}s, "
            f"waits on another rank's disk writes after {cfg.distributed_timeout:g}s"
        )

    # ---- the loop ---------------------------------------------------------------------------
    def _poll(self) -> bool:
        request = self._stream.poll(timeout=0.05)
        if request is None:
            return False
        # Said in an error: a save or checkpoint follows step `version`, the other calls make step
        # version + 1; a step node is named (with LoRA the ref runs on the actor's engine).
        call = request.handle_name
        if call == "step_node" and isinstance(request.data, dict):
            call = f"step node {request.data.get('node')}"
        at = (
            f"{call} at version {self.version}"
            if call in ("save", "checkpoint")
            else f"{call} of step {self.version + 1}"
        )

        def fatal(e: Exception) -> Optional[Exception]:
            # The ranks disagree on where they are: nothing more this group runs can be trusted.
            return e.at(at) if isinstance(e, collectives.CollectiveTimeoutError) else None

        self._stream.serve(request, self._handlers, self.logger, fatal)
        return True

    def _exit_hook(self) -> None:
        if getattr(self, "_broadcaster", None) is not None:
            self._broadcaster.close()
        if getattr(self, "_stream", None) is not None:
            self._stream.close()
        if getattr(self, "_dataset", None) is not None:
            self._dataset.close()
        for engine in getattr(self, "engines", {}).values():
            engine.destroy()
        if getattr(self, "_dist_initialized", False):
            dist.destroy_process_group()
        if getattr(self, "_store_socket", None) is not None:
            self._store_socket.close()

    # ---- handlers ---------------------------------------------------------------------------
    def _publish(self, weights: bool, broadcast: bool = True) -> str:
        """Collective: this version's weights to the generation servers (with `weights`), then
        rank 0 sets its number in name resolve (after the weights are in place: a reader never
        sees a version without them). `weight_sync=disk`, or a version the evaluator or the end
        of the run needs, or one whose broadcast failed: gathered from the shards and written as
        an HF directory by rank 0; otherwise broadcast to every routed (or joining) server
        (`weight_broadcast`). Returns the directory rank 0 wrote, "" on other ranks and without
        a disk write."""
        cfg = self.config
        out = trial_files.published_version_dir(cfg.run_dir, "actor", self.version)
        to_disk = weights
        if weights and broadcast and cfg.weight_sync == "distributed":
            sent = self._broadcast()
            # Every rank must agree before the collective save below.
            failed = collectives.agree_max([0 if sent else 1], self.device)[0]
            last = cfg.total_train_steps > 0 and self.version >= cfg.total_train_steps
            due = cfg.disk_every > 0 and self.version % cfg.disk_every == 0
            to_disk = bool(failed) or last or due
        if to_disk:
            self.engines["actor"].save_hf(out, cfg.actor.path)
            self._on_disk = self.version
        if self.rank != 0:
            return ""
        if to_disk:
            checkpoint.prune_versions(
                trial_files.published_weights_dir(cfg.run_dir, "actor"), cfg.keep_last_versions, current=self.version
            )
        key = names.model_version(self.ctx.experiment_name, self.ctx.trial_name, "actor")
        # Kept after exit: the last published version is part of the trial's record.
        name_resolve.add(key, str(self.version), replace=True, delete_on_exit=False)
        return str(out) if to_disk else ""

    def _how_published(self, published: str) -> str:
        b = self._last_broadcast
        if b is None:
            return "disk" if published or self.rank == 0 else "with rank 0"
        sent = f"broadcast to {len(b.servers)} server(s) {b.seconds:.2f}s" if b.ok else "broadcast failed"
        return sent + (" + disk" if published else "")

    def _broadcast(self) -> bool:
        """Collective over the DP ranks (each gathers its shards in step); rank 0 sends. True on
        rank 0 when every server in the weight group (routed or joining) got this version, and on
        every other rank."""
        tensors = self.engines["actor"].hf_tensors()
        if self.rank != 0:
            for _ in tensors:  # the gathers, in step with rank 0's
                pass
            return True
        if self._broadcaster is None:
            cfg = self.config
            key = names.gserver_manager(self.ctx.experiment_name, self.ctx.trial_name)
            self._broadcaster = WeightBroadcaster(
                lambda: self._broadcaster.ask_manager(name_resolve.get(key)),
                cfg.bind_host,
                cfg.weight_sync_backend,
                cfg.collective_timeout,
                cfg.weight_sync_bucket_mb * 2**20,
                secret=self.ctx.secret,
                ranks_per_server=cfg.ranks_per_server,
                pause=cfg.gen_backend == "sglang",
            )
        result = self._broadcaster.publish(self.version, tensors)
        self._last_broadcast = result
        return result.ok

    def _catch_up(self, data: Any) -> Dict[str, Any]:
        """Collective, asked by the master while it waits for a step's data: the current version
        again to the servers that joined since it was broadcast (weight_sync=distributed). A
        restarted server loads the newest version on disk, which is older than the trainer's
        when versions are only broadcast; the groups it makes are then too stale to train, and
        without them the trainer never makes the next version, whose broadcast would bring it up.
        Nothing to do for a version on disk (the manager brings servers up from there) or one
        never broadcast (at version 0 every server starts from the run's weights)."""
        if self.config.weight_sync != "distributed" or self.version == 0 or self._on_disk == self.version:
            return {"version": self.version, "sent_to": []}
        behind: List[str] = []
        if self.rank == 0 and self._broadcaster is not None:
            try:
                behind = self._broadcaster.missing(self.version)
            except Exception as e:  # noqa: BLE001 - the manager is away (restarting): ask again next time
                self.logger.debug(f"catch-up: routed servers unknown ({type(e).__name__}: {e})")
        with collectives.named(f"{self._where()}: catch-up (do the ranks send version {self.version} again)"):
            send = collectives.agree_max([1 if behind else 0], self.device)[0]
        if not send:
            return {"version": self.version, "sent_to": []}
        t0 = time.monotonic()
        self._last_broadcast = None
        how = self._how_published(self._publish(weights=True))
        if self.rank == 0:
            self.logger.info(
                f"version {self.version} sent again while the trainer waits for data: {behind} joined since "
                f"it was broadcast ({how}; {time.monotonic() - t0:.2f}s)"
            )
        return {"version": self.version, "sent_to": behind}

    def _initialize(self, data: Any) -> Dict[str, Any]:
        # Recovered: servers (re)starting now load these weights from disk.
        self._publish(weights=self.version > 0, broadcast=False)
        return {
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "tp_rank": self.tp_rank,
            "version": self.version,
            "n_params": self.engines["actor"].n_params,
            "resume": self._resume,
        }

    def _pull_into_buffer(self) -> None:
        for traj in self._dataset.get_available():  # parsed by the dataset's pull thread
            for dup in self._buffer.add([traj]):
                self.logger.warning(
                    f"refused group {dup.qid}: this DP head already received it "
                    f"({self._buffer.n_duplicates} duplicates in total)"
                )
        dropped = self._buffer.drop_stale(self.version)
        if dropped:
            self._dropped_qids += [g.qid for g in dropped]
            oldest = min(g.version_start for g in dropped)
            # Info, not a warning: what max_head_offpolicyness asks for (the step line counts them).
            self.logger.info(
                f"dropped {len(dropped)} stale groups (version_start >= {oldest}, need >= "
                f"{self.version - self._buffer.eta} at version {self.version}); {self._buffer.n_stale_dropped} in total; "
                f"qids {' '.join(g.qid for g in dropped)}"
            )

    def _fetch(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{take: n}`: move the n oldest trainable groups into this step's batch (n = 0: only report)."""
        if not self.is_head:
            raise ValueError(
                f"fetch sent to rank {self.rank} of DP rank {self.dp_rank}'s replica: only its head (rank {self.head_rank}) holds data"
            )
        self._pull_into_buffer()
        reply = {
            "dp_rank": self.dp_rank,
            "version": self.version,
            "buffered": len(self._buffer),
            "stale_dropped": self._buffer.n_stale_dropped,
            "received": self._dataset.n_pulled,
            # Malformed groups (refused by Trajectory.from_msg) were admitted and reported
            # accepted: the master hands them back to admission like stale drops.
            "rejected": self._dataset.n_invalid,
            "invalid": self._dataset.n_invalid,
            "duplicates": self._buffer.n_duplicates,
            "dropped_qids": self._dropped_qids,
            # The master's accounting (realhf.system.manager.admission_ledger): added = taken + stale + buffered.
            "added": self._buffer.n_added,
            "taken": self._buffer.n_taken,
        }
        self._dropped_qids = []  # the master keeps them (they are not pending at a checkpoint)
        take = int(data.get("take", 0))
        if take > 0:
            groups = self._buffer.take(take, self.version)
            self._taken, self._batch = groups, None
            summary = batch_summary(groups, self.version)
            summary["qids"] = [g.qid for g in groups]  # the master's trained_qids.jsonl
            reply["batch"] = summary
            # What the master balances the ranks by (realhf.system.master.dp_balance).
            reply["group_costs"] = [group_exchange.group_cost(g, self.config.ppo.shared_prompt) for g in groups]
            reply["buffered"], reply["taken"] = len(self._buffer), self._buffer.n_taken
            if int(data.get("completions", 0)) > 0:
                reply["completions"] = completion_log.completion_rows(groups, int(data["completions"]), self._decode)
            self.logger.info(
                f"version {self.version}: took {take} groups ({summary['n_samples']} samples, "
                f"{summary['gen_tokens']} trained tokens, head staleness max "
                f"{max(summary['head_offpolicyness'])}); {len(self._buffer)} still buffered"
            )
        return reply

    def _decode(self, ids: List[int]) -> str:
        if self._tokenizer is None:
            from transformers import AutoTokenizer  # only the rank that logs completions needs it

            self._tokenizer = AutoTokenizer.from_pretrained(self.config.actor.path)
        # Special tokens left out, as the agent's grader saw the answer (realhf.system.rollout.episode).
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def _balance(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """Collective `{assignment}`: the master's plan for where each rank's taken groups train
        (realhf.system.master.dp_balance); this rank's groups are exchanged and packed into the step's batch."""
        assignment = data["assignment"]
        groups: List[Trajectory] = []
        with collectives.named(f"{self._where()}: group exchange"):
            if self.is_head:
                group_exchange.check_assignment(assignment, self.dp_rank, len(self._taken), self.dp_size)
                groups = group_exchange.exchange(self._taken, assignment, self.dp_rank, self._cpu_group)
            if self.layout.world > self.dp_size:  # the replica's ranks split one model: they train the same batch
                groups = group_exchange.replicate(groups, self.head_rank, self._replica_group)
        self._taken = []
        self._batch = pack_trajectories(groups, self._pad_id())
        tokens = int(self._batch.attention_mask.sum())
        return {"dp_rank": self.dp_rank, "n_groups": len(groups), "n_seqs": self._batch.n_seqs, "tokens": tokens}

    def _need_batch(self, what: str) -> TrainBatch:
        if self._batch is None:
            raise RuntimeError(f"{what}: no batch; call fetch with take > 0, then balance, first")
        return self._batch

    def _pad_id(self) -> int:
        return int(getattr(self.engines["actor"].hf_config, "pad_token_id", None) or 0)

    def _step_node(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """Collective `{node}`: one node of the step's graph (realhf.system.trainer.ppo_step) on
        this rank's batch; the actor's update also advances the version and publishes it."""
        node = self.graph.node(data["node"])
        batch = self._need_batch(f"step node {node.name}")
        ctx = StepContext(self.engines, self.actor, self.critic, self.config.ppo, self.version)
        t0 = time.monotonic()
        reply = run_node(ctx, batch, node)
        if node.op == "train_actor":
            reply = self._after_actor_update(reply["stats"], time.monotonic() - t0)
        return reply

    def _get_tensors(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{names}`: this rank's batch tensors of those names, with what any forward of the batch
        needs (TrainBatch's required fields) — the inputs of a node that runs on the node worker."""
        batch = self._need_batch("get_tensors")
        wanted = dict.fromkeys(list(REQUIRED_FIELDS) + ["prompt_lens"] + list(data.get("names", [])))
        return {"tensors": {n: batch.get(n) for n in wanted if batch.get(n) is not None}}

    def _set_tensors(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{tensors}`: a node worker's outputs, set on this rank's batch by name."""
        batch = self._need_batch("set_tensors")
        for name, value in data["tensors"].items():
            batch.set(name, value)
        return {"set": sorted(data["tensors"])}

    def _after_actor_update(self, stats: Dict[str, Any], train_s: float) -> Dict[str, Any]:
        cfg = self.config
        t0 = time.monotonic()
        self.version += 1
        self._batch = None
        self._last_broadcast = None
        published = self._publish(weights=True)
        publish_s = time.monotonic() - t0
        how = self._how_published(published)
        if stats.get("skipped_steps"):
            self.logger.warning(
                f"version {self.version}: {stats['skipped_steps']} of {cfg.ppo.ppo_n_minibatches} "
                f"optimizer steps skipped: non-finite loss ({stats['loss']}) or gradient norm "
                f"({stats['grad_norm']}); the weights stay as they were"
            )
        if "loss" in stats:
            self.logger.info(
                f"version {self.version}: loss {stats['loss']:.4f} grad_norm {stats['grad_norm']:.3f} "
                f"clip {stats['clip_fraction']:.3f} {int(stats['n_tokens'])} tokens, train {train_s:.2f}s, "
                f"publish {publish_s:.2f}s ({how})"
            )
        else:
            self.logger.info(
                f"version {self.version}: critic warm-up, actor not trained; publish {publish_s:.2f}s ({how})"
            )
        return {
            "version": self.version,
            "stats": stats,
            "published": published,
            "train_time_s": train_s,
            "publish_time_s": publish_s,
        }

    def _save(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """Collective: an HF checkpoint at `path` (default `<run_dir>/checkpoints/actor/version<v>`)."""
        default = trial_files.checkpoints_dir(self.config.run_dir, "actor") / f"version{self.version}"
        path = data.get("path") or str(default)
        if self._on_disk != self.version and self.version > 0:
            # Broadcast only so far: the run's record (and the evaluation after it) reads the
            # newest published version from disk.
            self._publish(weights=True, broadcast=False)
        self.engines["actor"].save_hf(Path(path), self.config.actor.path)
        if self.rank == 0 and not data.get("path"):
            checkpoint.prune_saves(default.parent, self.config.keep_last_saves)
        return {"path": str(path), "version": self.version}

    def _checkpoint(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """Collective: the recovery checkpoint (every trained engine's shards, LR schedules, each
        rank's RNG, the version and the master's `extra` counters) in one atomic write."""
        extra = {**(data.get("extra") or {}), "version": self.version, "actor_state": self.actor.state_dict()}
        recover_checkpoint.save(
            self._recover_path, self._trained, self.rank, self.world_size, self.device, extra, self._io_group
        )
        return {"path": str(self._recover_path), "version": self.version}

    def _where(self) -> str:
        if self.layout.world == self.dp_size:
            return f"dp rank {self.dp_rank}/{self.dp_size}"
        where = f"rank {self.rank}/{self.world_size} (dp {self.dp_rank}/{self.dp_size}"
        where += f", tp {self.tp_rank}/{self.tp_size}" if self.tp_size > 1 else ""
        return where + (f", pp {self.pp_rank}/{self.pp_size})" if self.pp_size > 1 else ")")

    def _ping(self, data: Any) -> Dict[str, Any]:
        return {"dp_rank": self.dp_rank, "version": self.version, "buffered": len(self._buffer)}
