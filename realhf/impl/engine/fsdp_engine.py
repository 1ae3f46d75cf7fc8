"""FSDPEngine: the TrainEngine on torch FSDP2, one code path for the CPU (gloo) and GPUs (NCCL).

The HF model is loaded whole on every rank, then `fully_shard` is applied to each decoder layer
(the classes the model names in `_no_split_modules`) and to the root, over a 1-D device mesh of
all ranks. Each rank keeps 1/world of every parameter, gradient and optimizer state; a layer's
weights are gathered for its forward and backward and its gradients reduce-scattered after.

Data parallelism and the loss (docs/architecture.md §7): every rank trains on its own samples;
the loss of a step is Σ_ranks Σ loss_fn / Σ_ranks Σ loss_weight_fn, so each rank backpropagates
its own sum divided by the *global* weight and FSDP sums (does not average) the gradients. DP=N
then takes exactly the step DP=1 takes on the union of the ranks' samples.

At DP=1 the model stays unwrapped unless `shard_single_rank` (see FSDPEngineConfig for the
measurement behind that default) or a mixed-precision policy that only FSDP applies.

Checkpoints: `save_hf` gathers the full state dict on rank 0 and writes an HF directory through
realhf.impl.model.checkpoint; `save_recover` writes each rank's shards with
torch.distributed.checkpoint into a directory the caller makes atomic
(realhf.impl.model.recover_checkpoint: one temporary directory for every engine of a trainer,
fsynced and renamed in one step).

Kinds of model (FSDPEngineConfig): a causal LM (actor, reference; `.logits` `[n, t, V]`) or a
value model (critic; `.logits` `[n, t, 1]`), trainable or frozen (the reference: no optimizer,
no gradients, nothing to recover).

LoRA (`model.lora.r > 0`, realhf.impl.model.lora): peft wraps the loaded model before it is
sharded (the decoder layers keep their class inside the wrapper), only the adapters require
gradients, so the optimizer and the recovery checkpoint hold only them (recovery skips frozen
parameters: the base is reloaded from `model.path`); `save_hf` publishes the merged weights.

Tensor parallelism (`tp_size`, realhf.impl.engine.tensor_parallel) splits every decoder layer
over the `tp` dimension of the mesh. Pipeline parallelism (`pp_size`, realhf.impl.engine.
pipeline_parallel; engine level only, the system does not start it yet) keeps one stage of
consecutive layers per rank, original parameter names kept, on a (pp, dp, tp) mesh with FSDP2
over `dp` of each stage. Under it `forward` and `train_batch` run the plan's micro-batches, padded
to one shape, through torch's pipelining schedules (the shared-prompt forward is off: plain
forwards); the gradient norm is taken over every stage and `forward`'s result is broadcast from
the last stage, so every rank sees what an unsplit engine returns. `save_hf` and `hf_tensors`
gather the stages on rank 0 in order; the recovery checkpoint stores each stage's shards under
the unsplit names (optimizer state flattened), so it loads at any layout. LoRA is refused.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from realhf.api.cli_args import ModelTrainEvalConfig
from realhf.api.engine_api import LossFn, LossWeightFn, OutputFn, TrainEngine
from realhf.api.train_batch import TrainBatch
from realhf.base import collectives, memory_budget
from realhf.base.device import bind_device, dist_backend, pick_device
from realhf.base.dtypes import torch_dtype
from realhf.impl.engine import pipeline_calls, pipeline_parallel, tensor_parallel
from realhf.impl.engine.shared_prompt import shared_prompt_logits, shares_prompts
from realhf.impl.model import checkpoint, lora
from realhf.impl.model.batching import micro_batches
from realhf.impl.model.model_loading import load_causal_lm, load_value_model
from realhf.impl.model.optim import make_optimizer

_LR_SCHEDULE_FILE = "lr_schedule.json"
# Present where the optimizer state was saved flattened (one key per parameter for its state
# and its param group's settings): what pipeline stages write, since the stages' param groups
# list different parameters and would collide as one unflattened `param_groups` entry.
_FLAT_OPTIMIZER_FILE = "flat_optimizer"


@dataclass
class FSDPEngineConfig:
    model: ModelTrainEvalConfig = field(default_factory=ModelTrainEvalConfig)
    total_steps: int = 0  # optimizer steps of the run: the LR schedule's horizon (0: unknown)
    device: str = "auto"  # cluster.device, one of realhf.base.device.DEVICE_NAMES
    local_rank: int = 0  # which of the node's GPUs this rank uses
    # Mixed precision (FSDP2's MixedPrecisionPolicy): the dtype layers compute in and the dtype
    # gradients are reduced in; the sharded master weights stay in `model.dtype`.
    # None: float32 on the CPU, bfloat16 on a GPU.
    param_dtype: Optional[str] = None
    reduce_dtype: str = "float32"
    # Padded tokens (rows x longest row) per forward; 0: whole batch. No default here: the run's
    # config holds the one default (ppo.micro_batch_tokens, or the SFT/RM command's).
    micro_batch_tokens: int = field(kw_only=True)
    # Each prompt computed once for the rows of its group in a micro-batch (realhf.impl.engine.
    # shared_prompt); causal LMs only (a value head takes the plain forward), off under pp_size > 1.
    # No default here either: ppo.shared_prompt's, or False where no rows share a prompt.
    shared_prompt: bool = field(kw_only=True)
    # DP=1 only: fully_shard the model anyway. Off: with one rank FSDP's hooks and DTensors cost
    # time and save nothing (measured 13% slower per step, docs/benchmarks.md "Trainer engine").
    shard_single_rank: bool = False
    value_head: bool = False  # a critic: one output per position instead of the LM head
    trainable: bool = True  # False: frozen (the reference policy), no optimizer
    seed: int = 1  # initialises a value head (the same on every rank)
    name: str = "actor"  # the role (actor, ref, critic): errors name it
    # Tensor parallelism (allocation_mode's trainer `m`): ranks r..r+tp-1 form one model replica
    # splitting every decoder layer (realhf.impl.engine.tensor_parallel) and must be handed the
    # same batch; the world is dp x tp, FSDP2 shards over dp.
    tp_size: int = 1
    # Pipeline parallelism (realhf.impl.engine.pipeline_parallel): pp stages of consecutive
    # decoder layers, pp outermost (world = pp x dp x tp); the ranks of one pipeline are handed the
    # same batch. Engine level only: allocation_mode does not start trainers with p > 1 yet.
    pp_size: int = 1


class FSDPEngine(TrainEngine):
    def __init__(self, config: FSDPEngineConfig, io_group=None):
        self.config = config
        # Waits on another rank's disk writes (the barrier after save_hf, DCP's) go through this
        # group: its timeout is for disks, the default group's for compute (realhf.base.collectives).
        self.io_group = io_group
        self.device: Optional[torch.device] = None
        self.model: Optional[torch.nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.lr_scheduler: Optional[torch.optim.lr_scheduler.LambdaLR] = None
        self.sharded = False
        self._owns_group = False
        self.nonfinite_steps = 0  # optimizer steps skipped for a non-finite loss or gradient
        self.nonfinite_in_a_row = 0

    # ---- lifecycle ------------------------------------------------------------------------------

    def initialize(self) -> None:
        """Load `config.model.path`, shard it over the default process group (a one-rank group is
        created, and owned, when there is none), then AdamW + LambdaLR over the shards."""
        self.device = pick_device(self.config.device, self.config.local_rank)
        bind_device(self.device)
        if not dist.is_initialized():
            dist.init_process_group(dist_backend(self.device), store=dist.HashStore(), rank=0, world_size=1)
            self._owns_group = True
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.tp_size, self.pp_size = self.config.tp_size, self.config.pp_size
        if self.tp_size < 1 or self.pp_size < 1 or self.world_size % (self.tp_size * self.pp_size):
            raise ValueError(
                f"the {self.config.name} engine: tp_size={self.tp_size} x pp_size={self.pp_size} does not divide "
                f"the {self.world_size} trainer ranks"
            )
        self.dp_size = self.world_size // (self.tp_size * self.pp_size)
        self.dp_group = None  # all ranks (None) unless tensor or pipeline parallelism splits them
        # This rank's stage (pp outermost: ranks s*dp*tp .. (s+1)*dp*tp-1 are stage s).
        self.pp_rank = self.rank // (self.dp_size * self.tp_size)
        self.pp_group = None
        self.tied_group = None  # pp > 1 with a tied LM head: this rank's first-and-last-stage group

        if self.config.value_head:
            model = load_value_model(self.config.model, self.config.seed)
        else:
            model = load_causal_lm(self.config.model)
        if not self.config.trainable:
            model.requires_grad_(False)
        self.hf_config = model.config
        # What a gathered save writes (a model rebuilt from hf_config would derive its own).
        self.generation_config = getattr(model, "generation_config", None)
        self.lora_scaling = 0.0  # alpha / r of the adapters; 0: no LoRA
        if self.config.model.lora.r > 0:
            if self.config.value_head or not self.config.trainable:
                raise ValueError(
                    f"LoRA on a {'value model' if self.config.value_head else 'frozen model'} "
                    f"({self.config.model.path}): only the actor trains adapters"
                )
            model = lora.apply_lora(model, self.config.model.lora, self.config.seed)
            self.lora_scaling = self.config.model.lora.alpha / self.config.model.lora.r
        # The whole model's counts, taken before pipeline parallelism keeps one stage of it.
        self._n_params = sum(p.numel() for p in model.parameters())
        self._n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        mp = self._mixed_precision(model)
        # The dtype activations travel between pipeline stages in (the layers' compute dtype).
        self.compute_dtype = mp.param_dtype if mp is not None else next(model.parameters()).dtype
        self.sharded = self.world_size > 1 or self.config.shard_single_rank or mp is not None
        self.tied = False
        if self.pp_size > 1:
            if self.lora_scaling:
                raise ValueError(
                    f"the {self.config.name} engine: LoRA adapters under pipeline parallelism are not supported; "
                    "use p1 with actor.lora.r > 0"
                )
            where = f"the {self.config.name} engine ({self.config.model.path})"
            self.tied = pipeline_parallel.is_tied(model, self.config.value_head)
            pipeline_parallel.split_model(model, self.pp_rank, self.pp_size, self.config.value_head, where)
        if self.sharded:
            self._shard(model, mp or MixedPrecisionPolicy())
        shards = self.world_size // self.pp_size if self.sharded else 1
        memory_budget.check_device_fits(
            f"the {self.config.name} engine ({self.config.model.path}: weights"
            + (", gradients and AdamW states" if self.config.trainable else "")
            + f" over {shards} shard(s), FSDP x tensor parallel"
            + (f", pipeline stage {self.pp_rank} of {self.pp_size})" if self.pp_size > 1 else ")"),
            memory_budget.trainer_bytes(model, self.config.trainable, shards),
            self.device,
            "raise the trainer's data parallelism in allocation_mode (FSDP2 shards all of it over the ranks), "
            "train LoRA adapters (actor.lora.r), or give the trainer more of a shared GPU (cluster.gen_memory_fraction)",
        )
        model.to(self.device)
        self.model = model.train(self.config.trainable)
        if self.config.trainable:
            self.optimizer, self.lr_scheduler = make_optimizer(
                model, self.config.model.optimizer, self.config.total_steps
            )

    @property
    def n_params(self) -> int:
        """Parameters of the whole model (every stage's under pipeline parallelism)."""
        return self._n_params

    @property
    def n_trainable(self) -> int:
        return self._n_trainable

    def destroy(self) -> None:
        self.model = self.optimizer = self.lr_scheduler = None
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def _mixed_precision(self, model: torch.nn.Module) -> Optional[MixedPrecisionPolicy]:
        """The policy FSDP must apply; None when layers compute in the master weights' dtype."""
        name = self.config.param_dtype or ("float32" if self.device.type == "cpu" else "bfloat16")
        param, reduce = torch_dtype(name), torch_dtype(self.config.reduce_dtype)
        master = next(model.parameters()).dtype
        if param == master and reduce == master:
            return None
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)

    def _shard(self, model: torch.nn.Module, mp: MixedPrecisionPolicy) -> None:
        layer_classes = set(getattr(model, "_no_split_modules", None) or ())
        layers = [m for m in model.modules() if type(m).__name__ in layer_classes]
        if not layers:
            raise ValueError(
                f"{type(model).__name__} names no decoder-layer class in _no_split_modules; "
                "FSDPEngine shards per decoder layer and cannot wrap it"
            )
        if self.tp_size > 1 or self.pp_size > 1:
            # Ranks r*tp .. r*tp+tp-1 are one replica (tp innermost: on GPUs, the NVLink neighbours);
            # pp outermost: the stages of one pipeline are dp*tp ranks apart.
            mesh3d = init_device_mesh(
                self.device.type, (self.pp_size, self.dp_size, self.tp_size), mesh_dim_names=("pp", "dp", "tp")
            )
            if self.tp_size > 1:
                where = f"the {self.config.name} engine ({self.config.model.path})"
                tensor_parallel.check_tp_fits(model, layers, self.tp_size, where)
                tensor_parallel.apply_tp(layers, mesh3d["tp"])
            mesh = mesh3d["dp"]
            self.dp_group = mesh.get_group()
            if self.pp_size > 1:
                self.pp_group = mesh3d["pp"].get_group()
                if self.tied:
                    groups = pipeline_parallel.tied_groups(self.pp_size, self.dp_size, self.tp_size)
                    self.tied_group = groups.get(self.rank)
        else:
            mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp",))
        for layer in layers:
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        # The root's weights (embeddings, final norm, LM head) are the first the backward needs:
        # keep them gathered from forward to backward instead of gathering them twice.
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        if self.config.value_head:
            # FSDP2 warns that a value head's output is a view, which an in-place op would cut off
            # from its all-gather; every reader of it here works out of place
            # (realhf.system.trainer.actor.token_values, sequence_scores). Set once here, not
            # around each forward: changing the filters resets every once-only warning.
            warnings.filterwarnings("ignore", "FSDP2-wrapped module .* returned a view tensor", UserWarning)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                # Sum, not average, gradients over ranks: each rank's loss is already divided by
                # the global token count. Forced plain SUM: a divide factor otherwise selects
                # PREMUL_SUM, which only NCCL has.
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)

    # ---- compute --------------------------------------------------------------------------------

    def _named(self, call: str):
        """Collectives of `call`; a timeout names this rank, this engine and the call."""
        if self.pp_size > 1:
            dp_rank = (self.rank // self.tp_size) % self.dp_size
            where = (
                f"rank {self.rank}/{self.world_size} (pp {self.pp_rank}, dp {dp_rank}, tp {self.rank % self.tp_size})"
            )
        elif self.tp_size > 1:
            where = (
                f"rank {self.rank}/{self.world_size} (dp {self.rank // self.tp_size}, tp {self.rank % self.tp_size})"
            )
        else:
            where = f"dp rank {self.rank}/{self.world_size}"
        return collectives.named(f"{where}: {self.config.name} {call}")

    @torch.no_grad()
    def forward(self, batch: TrainBatch, output_fn: OutputFn) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            with self._named("forward"):
                if self.pp_size > 1:
                    return pipeline_calls.forward(self, batch, output_fn)
                out = torch.zeros((batch.n_seqs, batch.input_ids.shape[1] - 1), dtype=torch.float32)  # [N, T-1]
                for rows, shared in self._plan(batch):
                    if rows is None:
                        self._logits(self._padding_batch(), shared)
                        continue
                    mb = self._on_device(batch.select(rows))
                    y = output_fn(self._logits(mb, shared), mb)  # [n, t-1]
                    out[rows, : y.shape[1]] = y.detach().float().cpu()
                return out
        finally:
            self.model.train(was_training)

    def train_batch(self, batch: TrainBatch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> Dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError(f"train_batch on a frozen engine ({self.config.model.path}, trainable=False)")
        with self._named("train"):
            return self._train_batch(batch, loss_fn, loss_weight_fn)

    def _train_batch(self, batch: TrainBatch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> Dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        plan = self._plan(batch)
        local_weight = sum(float(loss_weight_fn(batch.select(rows))) for rows, _ in plan if rows is not None)
        global_weight = self._sum_over_ranks(local_weight)
        denominator = global_weight if global_weight > 0 else 1.0
        if self.pp_size > 1:
            local_loss = pipeline_calls.backward(self, batch, plan, loss_fn, denominator)
        else:
            local_loss = self._backward(batch, plan, loss_fn, denominator)

        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.config.model.optimizer.gradient_clipping
        max_norm = max_norm if max_norm > 0 else float("inf")
        if self.pp_size > 1:  # each stage's part of the norm, summed over the pipeline
            first, last = self.pp_rank == 0, self.pp_rank == self.pp_size - 1
            if self.tied:
                pipeline_parallel.sync_tied_grads(self.model, first, last, self.tied_group)
            skip = [self.model.lm_head.weight] if self.tied and last else []  # counted on stage 0
            grad_norm = pipeline_parallel.clip_grad_norm(params, max_norm, self.pp_group, skip)
        elif self.tp_size > 1:  # gradients on two meshes (realhf.impl.engine.tensor_parallel)
            grad_norm = tensor_parallel.clip_grad_norm(params, max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(grad_norm, DTensor):  # the norm over all shards, on every rank
            grad_norm = grad_norm.full_tensor()
        lr = float(self.optimizer.param_groups[0]["lr"])  # the LR this step uses
        loss = self._from_last_stage(self._sum_over_ranks(local_loss)) / denominator
        grad_norm = float(grad_norm)
        # The norm and the loss are global, so every rank takes the same decision.
        finite = math.isfinite(grad_norm) and math.isfinite(loss)
        if finite:
            self.optimizer.step()
            self.lr_scheduler.step()
            self.nonfinite_in_a_row = 0
        else:
            # A NaN or infinite gradient would poison every weight it touches (and every
            # published version after it): skip this step, weights, Adam state and LR unchanged.
            self.optimizer.zero_grad(set_to_none=True)
            self.nonfinite_steps += 1
            self.nonfinite_in_a_row += 1
            limit = self.config.model.optimizer.max_nonfinite_steps
            if self.nonfinite_in_a_row > limit:
                raise FloatingPointError(
                    f"{self.nonfinite_in_a_row} optimizer steps in a row had a non-finite loss ({loss}) or gradient "
                    f"norm ({grad_norm}) for {self.config.model.path}; optimizer.max_nonfinite_steps={limit}"
                )
        return {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "loss_weight": global_weight,
            "skipped": 0.0 if finite else 1.0,
        }

    def _backward(self, batch: TrainBatch, plan, loss_fn: LossFn, denominator: float) -> float:
        """Gradients accumulate over the micro-batches; each adds its loss sum / the global
        weight. Returns this rank's Σ loss_fn."""
        local_loss = 0.0
        for rows, shared in plan:
            if rows is None:
                # Zero loss through every layer: this rank joins the other ranks' collectives.
                (self._logits(self._padding_batch(), shared).float().sum() * 0.0).backward()
                continue
            mb = self._on_device(batch.select(rows))
            loss = loss_fn(self._logits(mb, shared), mb, rows)  # scalar: Σ over mb's tokens
            (loss / denominator).backward()
            local_loss += float(loss.detach())
        return local_loss

    def _plan(self, batch: TrainBatch) -> List[Tuple[Optional[torch.Tensor], bool]]:
        """(rows, shared) of each micro-batch, the same number and kinds on every rank.

        FSDP gathers each layer in every forward, so the ranks must run the same sequence of
        forwards: as many micro-batches as the rank with the most (a None is a forward on a
        padding row), and for each, the same kind — the shared-prompt forward (two model calls:
        prompts, then answers on their keys and values) wherever any rank runs it, the plain one
        (one call) elsewhere. Two small all-reduces agree on the plan before the first forward;
        a rank whose micro-batch shares no prompt runs it as groups of one row, same logits.
        """
        can_share = self._shares_prompts(batch)
        chunks = micro_batches(batch, torch.arange(batch.n_seqs), self.config.micro_batch_tokens, by_group=can_share)
        n = max(collectives.agree_max([len(chunks)], self.device)[0], 1)
        local = [int(can_share and shares_prompts(batch.group_ids[rows])) for rows in chunks]
        kinds = collectives.agree_max(local + [0] * (n - len(chunks)), self.device)
        padded: List[Optional[torch.Tensor]] = list(chunks) + [None] * (n - len(chunks))
        return [(rows, bool(kind)) for rows, kind in zip(padded, kinds)]

    def _shares_prompts(self, batch: TrainBatch) -> bool:
        # HF models keep no keys and values to share when they recompute activations; a pipeline
        # stage runs the plain forward (the shared-prompt forward is two model calls).
        return (
            self.config.shared_prompt
            and self.pp_size == 1
            and not self.config.value_head
            and batch.prompt_lens is not None
            and not self.config.model.gradient_checkpointing
        )

    def _logits(self, mb: TrainBatch, shared: bool) -> torch.Tensor:
        """`[n, t, V]` logits of `mb`, by the forward `_plan` agreed on for it."""
        if shared:
            # Rows that share no prompt go as groups of one row: the same two model calls.
            prompt_lens = mb.prompt_lens if mb.prompt_lens is not None else torch.ones_like(mb.group_ids)
            return shared_prompt_logits(
                self.model, mb.input_ids, mb.attention_mask, mb.group_ids, prompt_lens
            )  # [n, t, V]
        return self.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits  # [n, t, V]

    def _on_device(self, mb: TrainBatch) -> TrainBatch:
        return mb.to(self.device)

    def _padding_batch(self) -> TrainBatch:
        """One sample of two pad tokens and nothing to train (only the model's inputs are read)."""
        ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)  # [1, 2]
        no_tokens = torch.zeros((1, 1), dtype=torch.bool, device=self.device)  # [1, 1]
        one = torch.ones(1, dtype=torch.long, device=self.device)  # [1]
        return TrainBatch(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            loss_mask=no_tokens,
            behav_logprobs=no_tokens.float(),
            rewards=torch.zeros(1),
            group_ids=one * 0,
            prompt_lens=one,
        )  # a one-token prompt: the shared-prompt forward takes it too

    def _sum_over_ranks(self, x: float) -> float:
        """Σ over the data-parallel ranks (the tp ranks of a replica hold the same value)."""
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        if self.dp_size > 1:
            dist.all_reduce(t, group=self.dp_group)
        return float(t)

    def _from_last_stage(self, x: float) -> float:
        """The last pipeline stage's `x` on every stage (the others pass 0)."""
        if self.pp_size == 1:
            return x
        t = torch.tensor([x if self.pp_rank == self.pp_size - 1 else 0.0], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.pp_group)
        return float(t)

    # ---- HF weights -----------------------------------------------------------------------------

    def save_hf(self, path: Path, tokenizer_source: Optional[str] = None) -> None:
        """Collective: every rank sends its shards to rank 0, which writes `path` atomically."""
        with self._named("save"):
            self._save_hf(path, tokenizer_source)

    def _save_hf(self, path: Path, tokenizer_source: Optional[str]) -> None:
        if self.pp_size > 1:
            full = {n: t.cpu() for n, t in pipeline_calls.full_tensors(self, skip_tied=False)}
            if self.rank == 0:
                checkpoint.save_hf_dir(self._plain_hf_model(full), Path(path), tokenizer_source)
            collectives.barrier(self.io_group)
            return
        if not self.sharded and self.device.type == "cpu" and not self.lora_scaling:
            # One unwrapped rank holding the weights in host memory: save them as they are (the
            # gather and the rebuilt model below cost ~10 ms per publish of the tiny model).
            checkpoint.save_hf_dir(self.model, Path(path), tokenizer_source)
            return
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            if self.lora_scaling:
                # What the servers load: the base with the adapters merged in, under plain HF names.
                full = lora.merged_state_dict(full, self.lora_scaling)
            checkpoint.save_hf_dir(self._plain_hf_model(full), Path(path), tokenizer_source)
        collectives.barrier(self.io_group)  # the others wait for rank 0's disk write

    def hf_tensors(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """Collective: the weights a generation server loads, under HF names, one full tensor at a
        time (each gathered from the shards as it is reached, so no rank holds the model twice;
        LoRA: gathered at once, merged, then yielded). Every rank must run the generator to its
        end; rank 0 gets the tensors, the others get nothing. Pipeline parallelism: stage by stage,
        each stage's first rank sending them to rank 0; a tied LM head is sent once, as the
        embedding."""
        if self.pp_size > 1:
            with self._named("hf_tensors"):
                yield from pipeline_calls.full_tensors(self, skip_tied=True)
            return
        if not self.sharded or self.lora_scaling:
            if not self.sharded and not self.lora_scaling:
                yield from ((n, t.detach()) for n, t in self.model.state_dict().items())
                return
            full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if self.rank == 0:
                if self.lora_scaling:
                    full = lora.merged_state_dict(full, self.lora_scaling)
                yield from full.items()
            return
        with self._named("hf_tensors"):
            for name, t in get_model_state_dict(self.model).items():
                full = t.full_tensor() if isinstance(t, DTensor) else t
                if self.rank == 0:
                    yield name, full.detach()
                del full

    def _plain_hf_model(self, state: Dict[str, torch.Tensor]) -> torch.nn.Module:
        """An unwrapped HF model around `state`'s tensors (no copy): save_pretrained of the
        FSDP-wrapped model would write its generated class name into config.json."""
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

        auto = AutoModelForTokenClassification if self.config.value_head else AutoModelForCausalLM
        with torch.device("meta"):
            plain = auto.from_config(self.hf_config)
        plain.load_state_dict(state, strict=True, assign=True)
        if self.generation_config is not None and not self.config.value_head:
            plain.generation_config = self.generation_config
        # Gathered shards are separate tensors: tie a tied LM head to the embeddings again, so it
        # is stored once, as a one-rank save and from_pretrained store it (no-op when untied).
        plain.tie_weights()
        return plain

    def load_hf(self, path: Path) -> None:
        """Collective: every rank reads the safetensors files of `path` and keeps its shards."""
        with self._named("load"):
            self._load_hf(path)

    def _load_hf(self, path: Path) -> None:
        from safetensors.torch import load_file

        if self.lora_scaling:
            raise ValueError(
                f"load_hf({path}) into a LoRA engine: an HF directory holds merged weights, which "
                "cannot be split into a frozen base and adapters"
            )
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"load_hf: {path} has no *.safetensors file")
        state: Dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(str(f)))
        embedding = "model.embed_tokens.weight"
        if self.tied and pipeline_parallel.TIED_HEAD not in state and embedding in state:
            # The last stage's copy of a tied head, stored once as the embedding.
            state[pipeline_parallel.TIED_HEAD] = state[embedding]
        result = set_model_state_dict(self.model, state, options=StateDictOptions(full_state_dict=True, strict=False))
        # A tied weight (e.g. lm_head = embed_tokens) is stored once; every distinct parameter
        # must still have been loaded under one of its names.
        params = {name for name, _ in self.model.named_parameters()}
        missing = sorted(set(result.missing_keys) & params)
        if missing:
            raise ValueError(
                f"load_hf: {path} lacks weights for {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}; is it a checkpoint of the same architecture?"
            )

    # ---- recovery -------------------------------------------------------------------------------

    def save_recover(self, path: Path) -> None:
        """Collective: the shards of model and optimizer (torch.distributed.checkpoint) and the LR
        schedule into the directory `path`, on a file system all ranks see. Not atomic by itself:
        realhf.impl.model.recover_checkpoint writes every engine into one temporary directory and
        renames that."""
        path = Path(path)
        if self.rank == 0:
            path.mkdir(parents=True, exist_ok=True)
        with self._named("save"):
            collectives.barrier(self.io_group)
            model_state, optim_state = self._recover_state(flat=self.pp_size > 1)
            # DCP's own collectives wait for every rank's file writes: the disk group's timeout.
            dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(path), process_group=self.io_group)
        if self.rank == 0:
            (path / _LR_SCHEDULE_FILE).write_text(json.dumps(self.lr_scheduler.state_dict()))
            if self.pp_size > 1:
                (path / _FLAT_OPTIMIZER_FILE).write_text("")

    def load_recover(self, path: Path) -> None:
        path = Path(path)
        flat = (path / _FLAT_OPTIMIZER_FILE).exists()  # written by a pipeline: loads at any layout
        with self._named("load"):
            model_state, optim_state = self._recover_state(flat)
            state = {"model": model_state, "optim": optim_state}
            dcp.load(state, checkpoint_id=str(path), process_group=self.io_group)
        # With LoRA the frozen base is absent by design: a non-strict load, then every trained
        # parameter must have been restored.
        options = StateDictOptions(
            ignore_frozen_params=True, strict=not self.lora_scaling, flatten_optimizer_state_dict=flat
        )
        with self._named("load"):
            result = set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
                options=options,
            )
        lost = sorted(set(result.missing_keys) & set(model_state))
        if lost:
            raise ValueError(f"recovery checkpoint {path} lacks {lost[:5]}; was it written with the same actor.lora?")
        self.lr_scheduler.load_state_dict(json.loads((path / _LR_SCHEDULE_FILE).read_text()))

    def _recover_state(self, flat: bool):
        """The (model, optimizer) state a recovery checkpoint holds: with LoRA only the adapters'
        (a tied LM head is no parameter of its own, so ignore_frozen_params keeps it: dropped too).
        Recovery saves what training changes: a frozen weight (LoRA's base) is reloaded from its path."""
        options = StateDictOptions(ignore_frozen_params=True, flatten_optimizer_state_dict=flat)
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=options)
        if self.lora_scaling:
            trained = {name for name, p in self.model.named_parameters() if p.requires_grad}
            model_state = {k: v for k, v in model_state.items() if k in trained}
        return model_state, optim_state
