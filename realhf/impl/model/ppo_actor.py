"""PPOActor: what one trainer DP rank holds — the actor, the frozen reference (only when
`ppo.kl_ctl > 0`), AdamW and its LR schedule — and the two calls a train step makes on them.

    inference(batch, "actor" | "ref")   proximal / reference log-probs, stored on the batch
    train_step(batch)                   `ppo_n_minibatches` optimizer steps → global stats

It also owns the one piece of state that spans those calls, the proximal log-prob deferral:
`inference(batch, "actor")` may leave out the rows of the first minibatch, because that
minibatch's train forward runs before any optimizer step, with the proximal weights, and gives
the same log-probs; `train_step` of the same batch then fills them in. That needs train and eval
forwards that agree (no dropout) and advantages that do not read the proximal log-probs before
training (a KL reward through GAE does).

The PPO math lives in pure functions (realhf.impl.model.actor, .utils.ppo_functional); the model
worker keeps the data, the weight versions and the publishing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.impl.model import checkpoint
from realhf.impl.model.actor import first_minibatch_rows, has_dropout, inference_logprobs, ppo_train_step
from realhf.impl.model.batching import TrainBatch
from realhf.impl.model.model_loading import load_causal_lm, load_frozen
from realhf.impl.model.optim import make_optimizer

ROLES = ("actor", "ref")


class PPOActor:
    def __init__(self, actor: torch.nn.Module, ref: Optional[torch.nn.Module], ppo: PPOHyperparameters,
                 optimizer: OptimizerConfig, total_optimizer_steps: int):
        self.actor, self.ref, self.ppo = actor, ref, ppo
        self.gradient_clipping = optimizer.gradient_clipping
        self.optimizer, self.lr_scheduler = make_optimizer(actor, optimizer, total_optimizer_steps)
        self.can_defer_prox = not has_dropout(actor) and (ppo.group_adv_norm or ppo.kl_ctl == 0)
        # The batch whose first-minibatch proximal log-probs were left to its train forward.
        # Matched by identity, so a deferral never carries over to another batch.
        self._deferred_batch: Optional[TrainBatch] = None
        # Metadata of the recovery checkpoint this trainer resumed from (`version`, counters).
        self.recovered: Optional[Dict[str, Any]] = None

    @classmethod
    def from_config(cls, cfg: ModelWorkerConfig, recover_path: Optional[Path] = None) -> "PPOActor":
        """Load the models and build the optimizer. When `recover_path` holds a recovery
        checkpoint, the actor's weights come from it and its optimizer, LR-schedule and RNG state
        are restored (`recovered` then holds its metadata); otherwise the actor is `actor.path`."""
        recovering = recover_path is not None and checkpoint.has_recover_state(recover_path)
        actor = load_causal_lm(cfg.actor, str(recover_path) if recovering else None)
        ref = load_frozen(cfg.ref, cfg.ref.path or cfg.actor.path) if cfg.ppo.kl_ctl > 0 else None
        # The LR schedule counts optimizer steps: ppo_n_minibatches per train step.
        horizon = cfg.total_train_steps * cfg.ppo.ppo_n_minibatches
        trainer = cls(actor, ref, cfg.ppo, cfg.actor.optimizer, horizon)
        if recovering:
            trainer.recovered = checkpoint.load_recover_state(recover_path, trainer.optimizer, trainer.lr_scheduler)
        return trainer

    @property
    def pad_id(self) -> int:
        return int(getattr(self.actor.config, "pad_token_id", None) or 0)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.actor.parameters())

    def inference(self, batch: TrainBatch, role: str = "actor") -> Dict[str, Any]:
        """Log-probs of `batch` under `role` (actor → `batch.prox_logprobs`, ref →
        `batch.ref_logprobs`) and the numbers the master logs about them."""
        if role not in ROLES:
            raise ValueError(f"inference: model must be 'actor' or 'ref', got {role!r}")
        model = self.actor if role == "actor" else self.ref
        if model is None:
            raise ValueError("inference on 'ref' but no reference model is loaded (ppo.kl_ctl is 0)")
        t0 = time.monotonic()
        computed = torch.ones(batch.n_seqs, dtype=torch.bool)  # [N] rows whose log-probs this call computes
        if role == "actor":
            self._deferred_batch = batch if self.can_defer_prox else None
            if self.can_defer_prox:
                computed[first_minibatch_rows(batch.n_seqs, self.ppo.ppo_n_minibatches)] = False
        rows = None if computed.all() else torch.nonzero(computed).flatten()
        logp = inference_logprobs(model, batch, self.ppo.gen.temperature,
                                  micro_batch_tokens=self.ppo.micro_batch_tokens, rows=rows)  # [N, T-1]
        if role == "actor":
            batch.prox_logprobs = logp
        else:
            batch.ref_logprobs = logp
        mask = batch.loss_mask & computed[:, None]  # [N, T-1]
        n = max(int(mask.sum()), 1)
        return {"model": role, "n_tokens": int(mask.sum()), "time_s": time.monotonic() - t0,
                "logprob_mean": float(logp[mask].sum()) / n,
                # Sampler vs trainer agreement: large only when the weights moved (staleness).
                "behav_abs_diff": float((logp - batch.behav_logprobs)[mask].abs().sum()) / n}

    def train_step(self, batch: TrainBatch) -> Dict[str, float]:
        """`ppo_n_minibatches` optimizer steps on `batch`; global (all-rank) stats."""
        stats = ppo_train_step(self.actor, self.optimizer, self.lr_scheduler, batch, self.ppo, self.gradient_clipping,
                               prox_from_first_forward=self._deferred_batch is batch)
        self._deferred_batch = None
        return stats

    def save_recover_state(self, path: Path, version: int, tokenizer_source: Optional[str],
                           extra: Optional[Dict[str, Any]] = None) -> Path:
        """Weights, optimizer, LR schedule, RNG state and `version` (+ `extra`) in one atomic write."""
        return checkpoint.save_recover_state(path, self.actor, self.optimizer, self.lr_scheduler, version,
                                             tokenizer_source, extra=extra)
