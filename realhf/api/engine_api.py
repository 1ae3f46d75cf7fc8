"""TrainEngine: what a trainer holds per model (actor, reference, critic) — one model, sharded
over the data-parallel ranks, with its optimizer — and the calls a train step makes on it.

Every call is collective: all DP ranks make it, in the same order, each with its own batch.
Batches use the trainer's padded layout (realhf.impl.model.batching.TrainBatch): `input_ids`,
`attention_mask` `[N, T]`, per-prediction tensors such as `loss_mask` `[N, T-1]`. The engine
cuts a batch into micro-batches; the callbacks see one micro-batch `mb`, on the engine's device,
and the CPU indices `rows` of its samples in the whole batch (to slice side tensors such as
advantages, which the callback moves to `output.device`).

    output_fn(output [n, t, V], mb) -> [n, t-1]            e.g. the log-probs of mb's tokens
    loss_fn(output [n, t, V], mb, rows) -> scalar          the loss SUMMED over mb's tokens
    loss_weight_fn(mb) -> float                            how many tokens that sum covers
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Callable, Dict, Optional

import torch

from realhf.api.train_batch import TrainBatch

OutputFn = Callable[[torch.Tensor, TrainBatch], torch.Tensor]
LossFn = Callable[[torch.Tensor, TrainBatch, torch.Tensor], torch.Tensor]
LossWeightFn = Callable[[TrainBatch], float]


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def initialize(self) -> None:
        """Load the model from its HF path, shard it over the DP ranks, build optimizer and LR schedule."""

    @abc.abstractmethod
    def forward(self, batch: TrainBatch, output_fn: OutputFn) -> torch.Tensor:
        """`output_fn` of every micro-batch without gradients, as one CPU `[N, T-1]` tensor (0 on padding)."""

    @abc.abstractmethod
    def train_batch(self, batch: TrainBatch, loss_fn: LossFn, loss_weight_fn: LossWeightFn) -> Dict[str, float]:
        """One optimizer step on Σ_ranks Σ loss_fn / Σ_ranks Σ loss_weight_fn, skipped (weights
        unchanged) when the loss or the gradient norm is not finite; stats: loss, grad_norm, lr,
        loss_weight, skipped."""

    @abc.abstractmethod
    def save_hf(self, path: Path, tokenizer_source: Optional[str] = None) -> None:
        """Write a full HF directory (safetensors, config, tokenizer files from `tokenizer_source`) from rank 0."""

    @abc.abstractmethod
    def load_hf(self, path: Path) -> None:
        """Replace the weights with those of the HF directory `path`."""

    @abc.abstractmethod
    def save_recover(self, path: Path) -> None:
        """Write the sharded model, optimizer and LR-schedule state into the directory `path`
        (the caller makes a checkpoint of several engines atomic: realhf.impl.model.recover_checkpoint)."""

    @abc.abstractmethod
    def load_recover(self, path: Path) -> None:
        """Restore what `save_recover` wrote (an engine initialized with the same config and DP size)."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Release the model, the optimizer and any process group the engine created."""
