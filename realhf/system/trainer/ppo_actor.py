"""The models of one trainer DP rank as TrainEngines, and what a train step asks of each.

    engine_config(cfg, role, local_rank)   the FSDPEngine of `actor`, `ref` (frozen) or `critic`
    PPOActor      proximal log-probs (with the deferral below), `ppo_n_minibatches` PPO steps,
                  and the KL coefficient (fixed or adaptive), which it saves with the trainer state
    PPOCritic     values, and `ppo_n_minibatches` steps of the clipped value loss
    reference_logprobs / ensure_advantages   the reference's log-probs; the step's advantages,
                  computed once before the first train call

The deferral: `PPOActor.compute_logprobs` may leave out the rows of the first minibatch, because
that minibatch's train forward runs before any optimizer step of the train step, with the
proximal weights, and gives the same log-probs; `train_step` of the same batch fills them in
(`batch.prox_computed` marks the rows computed, so a deferral never carries over to another batch).
That needs train and eval forwards that agree (no dropout) and advantages that do not read the
proximal log-probs (GAE with a KL reward does).

The PPO math is in realhf.system.trainer.actor; the step's graph (realhf.system.trainer.ppo_step)
says which of these run, and its ops (realhf.system.trainer.step_ops) call them.
"""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Sequence

import torch

from realhf.api.cli_args import PPOHyperparameters
from realhf.api.engine_api import TrainEngine
from realhf.api.train_batch import TrainBatch
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.base.device import all_reduce_sum
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig
from realhf.impl.model.algorithms import KLController, estimator
from realhf.impl.model.batching import minibatch_rows
from realhf.impl.model.lora import BaseModelView
from realhf.system.trainer.actor import (
    ActorLoss,
    CriticLoss,
    compute_advantages,
    first_minibatch_rows,
    has_dropout,
    token_logprobs,
    token_values,
)

ROLES = ("actor", "ref", "critic", "reward")


def engine_config(cfg: ModelWorkerConfig, role: str, local_rank: int) -> FSDPEngineConfig:
    """The engine of `role`: the reference and the critic load `actor.path` when their own path is
    empty; a reward model (frozen, a value head) must name its own."""
    if role not in ROLES:
        raise ValueError(f"unknown model role {role!r}; known: {ROLES}")
    model = {"actor": cfg.actor, "ref": cfg.ref, "critic": cfg.critic, "reward": cfg.reward}[role]
    if role == "reward" and not model.path:
        raise ValueError(
            "a reward_model node runs on `reward`, whose path is empty: set reward.path=<training/main_rm.py's output>"
        )
    if not model.path:
        model = type(model)(**{**model.__dict__, "path": cfg.actor.path})
    return FSDPEngineConfig(
        model=model,
        device=cfg.device,
        local_rank=local_rank,
        micro_batch_tokens=cfg.ppo.micro_batch_tokens,
        shared_prompt=cfg.ppo.shared_prompt,
        # The LR schedule counts optimizer steps: ppo_n_minibatches per train step.
        total_steps=cfg.total_train_steps * cfg.ppo.ppo_n_minibatches,
        value_head=role == "critic" or (role == "reward" and cfg.ppo.graph.reward_model_kind == "value_head"),
        trainable=role in ("actor", "critic"),
        seed=cfg.seed,
        name=role,
        tp_size=cfg.tp_size,
        pp_size=cfg.pp_size,
        param_dtype=model.param_dtype or None,
        reduce_dtype=model.reduce_dtype,
    )


def build_engines(
    cfg: ModelWorkerConfig, local_rank: int, io_group=None, *, roles: Sequence[str]
) -> Dict[str, FSDPEngine]:
    """The engines of `roles` (the models the step's graph names), actor first. With `actor.lora`
    the reference is the actor's own model with its adapters disabled (lora.BaseModelView), not a
    second copy, where the actor is here too. `io_group`: where the ranks wait for each other's disk writes
    (realhf.base.collectives)."""
    engines = {}
    for role in sorted(dict.fromkeys(roles), key=lambda r: r != "actor"):  # a LoRA reference views the actor
        if role == "ref" and cfg.actor.lora.r > 0 and "actor" in engines:
            engines[role] = BaseModelView(engines["actor"])
            continue
        engine = FSDPEngine(engine_config(cfg, role, local_rank), io_group)
        engine.initialize()
        engines[role] = engine
    return engines


def ensure_advantages(batch: TrainBatch, ppo: PPOHyperparameters, kl_coef: Optional[float] = None) -> None:
    """Compute the step's advantages and returns once, before the first train call reads them."""
    if batch.advantages is None:
        batch.advantages, batch.returns = compute_advantages(batch, ppo, kl_coef)


def inference_stats(
    role: str, out: torch.Tensor, batch: TrainBatch, computed: torch.Tensor, t0: float
) -> Dict[str, Any]:
    mask = batch.loss_mask & computed[:, None]  # [N, T-1]
    n = max(int(mask.sum()), 1)
    stats = {"model": role, "n_tokens": int(mask.sum()), "time_s": time.monotonic() - t0}
    if role == "critic":
        stats["value_mean"] = float(out[mask].sum()) / n
    else:
        stats["logprob_mean"] = float(out[mask].sum()) / n
        # Sampler vs trainer agreement: large only when the weights moved (staleness).
        stats["behav_abs_diff"] = float((out - batch.behav_logprobs)[mask].abs().sum()) / n
    return stats


def reference_logprobs(engine: TrainEngine, batch: TrainBatch, temperature: float) -> Dict[str, Any]:
    """`batch.ref_logprobs` under the frozen reference."""
    t0 = time.monotonic()
    batch.ref_logprobs = engine.forward(batch, lambda out, mb: token_logprobs(out, mb, temperature))  # [N, T-1]
    return inference_stats("ref", batch.ref_logprobs, batch, torch.ones(batch.n_seqs, dtype=torch.bool), t0)


def _minibatch_steps(engine: TrainEngine, batch: TrainBatch, n_minibatches: int, loss, fill_first: bool = False):
    """One engine optimizer step per minibatch; returns (grad norms, LR of the last step, the
    global loss weight, steps skipped for a non-finite loss or gradient)."""
    norms, lr, weight, skipped = [], 0.0, 0.0, 0
    for i, rows in enumerate(minibatch_rows(batch, n_minibatches)):
        fn = loss.for_rows(rows, fill_prox=True) if fill_first and i == 0 else loss.for_rows(rows)
        out = engine.train_batch(batch.select(rows), fn, loss.weight)
        norms.append(out["grad_norm"])
        lr, weight, skipped = out["lr"], weight + out["loss_weight"], skipped + int(out["skipped"])
    return norms, lr, weight, skipped


class PPOActor:
    def __init__(self, engine: FSDPEngine, ppo: PPOHyperparameters):
        self.engine, self.ppo = engine, ppo
        self.kl = KLController(ppo.kl_ctl, ppo.kl_target, ppo.kl_horizon)
        # A KL reward (gae, reinforce with kl_ctl > 0) reads the proximal log-probs in the advantages.
        kl_reward = ppo.kl_ctl > 0 and estimator(ppo.adv_estimator).kl_in_reward
        self.can_defer_prox = not has_dropout(engine.model) and not kl_reward

    def compute_logprobs(self, batch: TrainBatch) -> Dict[str, Any]:
        """`batch.prox_logprobs` under the current weights (all rows, or all but the first
        minibatch's when deferring) and the numbers the master logs about them."""
        t0 = time.monotonic()
        computed = torch.ones(batch.n_seqs, dtype=torch.bool)  # [N] rows this call computes
        if self.can_defer_prox:
            computed[first_minibatch_rows(batch, self.ppo.ppo_n_minibatches)] = False
        rows = torch.nonzero(computed).flatten()
        temperature = self.ppo.gen.temperature
        part = self.engine.forward(batch.select(rows), lambda out, mb: token_logprobs(out, mb, temperature))
        logp = torch.zeros_like(batch.behav_logprobs)  # [N, T-1]
        logp[rows, : part.shape[1]] = part
        batch.prox_logprobs, batch.prox_computed = logp, computed
        return inference_stats("actor", logp, batch, computed, t0)

    def train_step(self, batch: TrainBatch, version: Optional[int] = None) -> Dict[str, float]:
        """`ppo_n_minibatches` optimizer steps on `batch`; global (all-rank) stats. `version`: the
        weights' version now (needed by `ppo.prox_logp=loglinear`)."""
        loglinear = self.ppo.use_decoupled_loss and self.ppo.prox_logp == "loglinear"
        # The first minibatch's proximal log-probs come from its own train forward when
        # compute_logprobs left them out (batch.prox_computed says so), or with loglinear.
        left_out = batch.prox_computed is not None and not bool(batch.prox_computed.all())
        deferred = left_out or (loglinear and self.can_defer_prox)
        kl_coef = self.kl.value
        ensure_advantages(batch, self.ppo, kl_coef)
        loss = ActorLoss(batch, self.ppo, kl_coef, version)
        norms, lr, weight, skipped = _minibatch_steps(self.engine, batch, self.ppo.ppo_n_minibatches, loss, deferred)
        out = loss.global_stats(weight)
        n_tokens = out["n_tokens"]
        out.update(grad_norm=sum(norms) / len(norms), lr=lr, skipped_steps=skipped)
        adv = batch.advantages[batch.loss_mask]
        sums = all_reduce_sum(
            torch.tensor([float(adv.sum()), float((adv**2).sum()), batch.n_seqs], dtype=torch.float64)
        )
        mean, sq = float(sums[0]) / max(n_tokens, 1.0), float(sums[1]) / max(n_tokens, 1.0)
        out.update(adv_mean=mean, adv_std=max(sq - mean**2, 0.0) ** 0.5)
        if self.ppo.kl_ctl > 0:
            out["kl_coef"] = kl_coef  # the coefficient this step used
            self.kl.update(out["kl_ref"], float(sums[2]))
        return out

    def state_dict(self) -> Dict[str, Any]:
        """What a recovery checkpoint keeps of the actor besides its engine (JSON)."""
        return self.kl.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.kl.load_state_dict(state)


class PPOCritic:
    def __init__(self, engine: FSDPEngine, ppo: PPOHyperparameters, kl: Optional[KLController] = None):
        # The actor's KL coefficient: a KL reward (gae) must use the one the actor's step uses.
        self.engine, self.ppo, self.kl = engine, ppo, kl

    def compute_values(self, batch: TrainBatch) -> Dict[str, Any]:
        """`batch.values`: the critic's value of every predicted position."""
        t0 = time.monotonic()
        batch.values = self.engine.forward(batch, token_values)  # [N, T-1]
        return inference_stats("critic", batch.values, batch, torch.ones(batch.n_seqs, dtype=torch.bool), t0)

    def train_step(self, batch: TrainBatch) -> Dict[str, float]:
        """`ppo_n_minibatches` steps of the clipped value loss toward the step's returns."""
        ensure_advantages(batch, self.ppo, None if self.kl is None else self.kl.value)
        loss = CriticLoss(batch, self.ppo)
        norms, lr, n_tokens, skipped = _minibatch_steps(self.engine, batch, self.ppo.ppo_n_minibatches, loss)
        out = loss.stats.global_means(n_tokens)
        out.update(critic_grad_norm=sum(norms) / len(norms), critic_lr=lr, critic_skipped_steps=skipped)
        return out
