"""NodeWorker: the step's nodes of `ppo.graph.own_process`, on engines of their own, beside the trainer.

    configure: the step's graph (realhf.system.trainer.ppo_step) → the engines its placed nodes
               run on (the frozen reference; one rank, its own process group) → connect to the
               master's request socket after the model workers (index `stream_index`)
    loop:      `step_node {node, batches}`: the node on each DP rank's inputs (the tensors the
               master took from the trainer ranks) → `{outputs, stats}` per DP rank, which the
               master sets on the ranks' batches; `ping`

The trainer's nodes of the same wave run meanwhile (the master posts both before waiting), so a
reference forward here overlaps the actor's proximal forward there. It holds no state a step
changes: the reference is frozen.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from realhf.api.train_batch import batch_from_tensors
from realhf.api.worker_configs import ModelWorkerConfig, NodeWorkerConfig
from realhf.base.device import bind_device, dist_backend, pick_device
from realhf.system.streams.request_reply_stream import WorkerStream
from realhf.system.trainer.ppo_actor import build_engines
from realhf.system.trainer.ppo_step import build_graph
from realhf.system.trainer.step_ops import StepContext, run_node
from realhf.system.worker_base import Worker


class NodeWorker(Worker):
    config_cls = NodeWorkerConfig

    def _configure(self) -> None:
        cfg: NodeWorkerConfig = self.config
        self._stream: Optional[WorkerStream] = None
        torch.set_num_threads(cfg.ref.n_threads)
        torch.manual_seed(cfg.seed)
        self.graph = build_graph(cfg.ppo)
        self.nodes = {n: self.graph.node(n) for n in cfg.ppo.graph.own_process}
        models = list(dict.fromkeys(n.model for n in self.nodes.values() if n.model))
        self.device = pick_device(cfg.device, 0)
        bind_device(self.device)
        dist.init_process_group(dist_backend(self.device), store=dist.HashStore(), rank=0, world_size=1)
        self._dist_initialized = True
        t0 = time.monotonic()
        engine_cfg = ModelWorkerConfig(
            actor=cfg.actor,
            ref=cfg.ref,
            critic=cfg.critic,
            reward=cfg.reward,
            ppo=cfg.ppo,
            device=cfg.device,
            seed=cfg.seed,
        )
        self.engines = build_engines(engine_cfg, 0, roles=models)
        self.logger.info(
            f"node worker on {self.device}: nodes {sorted(self.nodes)}, engines "
            + (", ".join(f"{m} {e.n_params / 1e6:.2f}M params" for m, e in self.engines.items()) or "none")
            + f", loaded in {time.monotonic() - t0:.1f}s; {cfg.ref.n_threads} torch threads"
        )
        self._handlers: Dict[str, Callable[[Any], Any]] = {"step_node": self._step_node, "ping": self._ping}
        self._stream = WorkerStream(
            self.ctx.experiment_name,
            self.ctx.trial_name,
            cfg.stream_index,
            discovery_timeout=cfg.master_discovery_timeout,
            secret=self.ctx.secret,
            max_message_bytes=cfg.max_message_bytes,
        )

    def _step_node(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """`{node, batches}`: the node on every DP rank's batch; its outputs and stats per rank."""
        name = data["node"]
        if name not in self.nodes:
            raise ValueError(f"node {name!r} is not placed here; this node worker runs {sorted(self.nodes)}")
        node = self.nodes[name]
        ctx = StepContext(self.engines, None, None, self.config.ppo, version=0)
        outputs: List[Dict[str, torch.Tensor]] = []
        stats: List[Dict[str, Any]] = []
        for tensors in data["batches"]:
            batch = batch_from_tensors(tensors)
            stats.append(run_node(ctx, batch, node))
            outputs.append({t: batch.get(t) for t in node.outputs})
        return {"outputs": outputs, "stats": stats}

    def _ping(self, data: Any) -> Dict[str, Any]:
        return {"nodes": sorted(self.nodes)}

    def _poll(self) -> bool:
        request = self._stream.poll(timeout=0.05)
        if request is None:
            return False
        self._stream.serve(request, self._handlers, self.logger)
        return True

    def _exit_hook(self) -> None:
        if self._stream is not None:
            self._stream.close()
        for engine in getattr(self, "engines", {}).values():
            engine.destroy()
        if getattr(self, "_dist_initialized", False):
            dist.destroy_process_group()
