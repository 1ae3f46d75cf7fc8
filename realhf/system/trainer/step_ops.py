"""What each node of the train step does on a trainer rank (the graph: realhf.system.trainer.ppo_step).

    run_node(ctx, batch, node)   the node's op on `batch`; checks its inputs are there first and
                                 its outputs after, and returns the numbers it reports

An op is `fn(ctx, batch, node) -> dict`: it reads `node.inputs` and sets `node.outputs` of the
batch (`batch.set`), and the dict (numbers) goes back to the master. A user's op is named by
import path (realhf.api.step_graph) and called the same way.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

import torch

from realhf.api.cli_args import PPOHyperparameters
from realhf.api.engine_api import TrainEngine
from realhf.api.step_graph import StepNode
from realhf.api.train_batch import TrainBatch
from realhf.base.importing import import_object
from realhf.impl.model.reward_card import RewardCard, read_card
from realhf.system.trainer.actor import implicit_scores, sequence_scores, token_logprobs
from realhf.system.trainer.ppo_actor import PPOActor, PPOCritic, ensure_advantages, inference_stats

Op = Callable[["StepContext", TrainBatch, StepNode], Dict[str, Any]]


@dataclass
class StepContext:
    """What a node may use on this rank: the engines by model name, the actor's and critic's
    trainers, the settings, and the weights' version the step started from."""

    engines: Dict[str, TrainEngine]
    actor: PPOActor
    critic: Optional[PPOCritic]
    ppo: PPOHyperparameters
    version: int


def proximal_logprobs(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    return ctx.actor.compute_logprobs(batch)


def logprobs(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    """Log-probs of the sampled tokens under `node.model`, at the sampling temperature."""
    t0, temperature = time.monotonic(), ctx.ppo.gen.temperature
    out = ctx.engines[node.model].forward(batch, lambda logits, mb: token_logprobs(logits, mb, temperature))
    batch.set(node.outputs[0], out)  # [N, T-1]
    return inference_stats(node.model, out, batch, torch.ones(batch.n_seqs, dtype=torch.bool), t0)


def values(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    return ctx.critic.compute_values(batch)


def reward_model(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    """A learned reward (realhf.experiments.rm): `node.model`'s score of each sample's prompt and
    answer, at its last token, per sample [N]."""
    t0 = time.monotonic()
    out = ctx.engines[node.model].forward(batch, lambda output, mb: sequence_scores(output, mb)[:, None])
    scores = out[:, 0].contiguous()  # [N]
    batch.set(node.outputs[0], scores)
    return {
        "mean": float(scores.mean()),
        "std": float(scores.std()) if len(scores) > 1 else 0.0,
        "time_s": time.monotonic() - t0,
    }


def implicit_reward(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    """An implicit reward model's score of each sample [N]: beta * the sum over its answer's tokens
    of `node.model`'s log-probs minus the reference's (`ref_logprobs`, the model it was trained
    from; both at the sampling temperature), beta from its card (realhf.impl.model.reward_card)."""
    t0, engine = time.monotonic(), ctx.engines[node.model]
    card = _card(engine.config.model.path)
    logprobs = engine.forward(batch, lambda logits, mb: token_logprobs(logits, mb, ctx.ppo.gen.temperature))
    scores = implicit_scores(logprobs, batch.ref_logprobs, batch.loss_mask, card.beta)  # [N]
    batch.set(node.outputs[0], scores)
    return {
        "mean": float(scores.mean()),
        "std": float(scores.std()) if len(scores) > 1 else 0.0,
        "time_s": time.monotonic() - t0,
    }


@functools.lru_cache(maxsize=None)
def _card(path: str) -> RewardCard:
    card = read_card(path)
    if card is None or card.kind != "implicit":
        raise ValueError(f"{path}: not an implicit reward model (its realhf_reward.json says {card})")
    return card


def advantages(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    """Advantages and returns of the rollout's rewards plus the graph's reward terms
    (`rewards/<source>`), each times its weight (`node.args["weights"]`, default 1; from
    ppo.graph.reward_weights), with the KL coefficient the actor's update will use."""
    weights = node.args.get("weights", {})
    terms = [t for t in node.inputs if t.startswith("rewards/")]
    scored = batch
    if terms or weights:
        total = batch.rewards.to(torch.float32) * float(weights.get("rewards", 1.0))  # [N]
        for t in terms:
            total += batch.get(t).to(torch.float32) * float(weights.get(t, 1.0))
        scored = dataclasses.replace(batch, rewards=total)
    ensure_advantages(scored, ctx.ppo, ctx.actor.kl.value)
    batch.advantages, batch.returns = scored.advantages, scored.returns
    return {}


def train_critic(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    t0 = time.monotonic()
    stats = ctx.critic.train_step(batch)
    return {"stats": stats, "train_time_s": time.monotonic() - t0}


def train_actor(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    """The actor's ppo_n_minibatches optimizer steps (none while the critic warms up)."""
    if ctx.critic is not None and ctx.version < ctx.ppo.critic_warmup_steps:
        return {"stats": {"actor_frozen": 1.0}}  # the version still advances, the weights stay
    return {"stats": ctx.actor.train_step(batch, ctx.version)}


OPS: Dict[str, Op] = {
    "proximal_logprobs": proximal_logprobs,
    "logprobs": logprobs,
    "values": values,
    "advantages": advantages,
    "reward_model": reward_model,
    "implicit_reward": implicit_reward,
    "train_critic": train_critic,
    "train_actor": train_actor,
}


def op_of(node: StepNode) -> Op:
    return OPS[node.op] if node.op in OPS else import_object(node.op, f"step node {node.name!r}: op")


def run_node(ctx: StepContext, batch: TrainBatch, node: StepNode) -> Dict[str, Any]:
    missing = [t for t in node.inputs if batch.get(t) is None]
    if missing:
        raise RuntimeError(f"step node {node.name!r}: its inputs {missing} are not there (did their nodes run?)")
    reply = op_of(node)(ctx, batch, node)
    unwritten = [t for t in node.outputs if batch.get(t) is None]
    if unwritten:
        raise RuntimeError(f"step node {node.name!r} ({node.op}) did not write {unwritten}")
    if not isinstance(reply, dict):
        raise TypeError(f"step node {node.name!r} ({node.op}) returned {type(reply).__name__}, not a dict")
    return reply
