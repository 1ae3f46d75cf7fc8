"""realhf/system/trainer/ppo_actor.py on the real tiny model at DP=1: which engines a trainer holds
and how they are configured, the proximal log-prob deferral PPOActor carries from
`compute_logprobs` to `train_step`, and PPOCritic's values and value-loss steps. No processes,
no sockets. (critic_warmup_steps is the model worker's rule, tested there.)"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from helpers.fsdp_ranks import open_engines
from helpers.trajectories import TINY_SFT, flat_params, pack, trainer_config
from realhf.api.cli_args import ModelTrainEvalConfig, PPOHyperparameters
from realhf.system.trainer.actor import first_minibatch_rows
from realhf.system.trainer.ppo_actor import (
    PPOActor,
    PPOCritic,
    build_engines,
    engine_config,
    reference_logprobs,
)
from realhf.system.trainer.ppo_step import default_graph

# ---- which engines, configured how ---------------------------------------------------------------


def test_a_trainer_holds_a_reference_only_for_a_kl_term_and_a_critic_only_for_gae():
    def roles_of(ppo):
        return default_graph(ppo).models()

    assert roles_of(PPOHyperparameters()) == ["actor"]
    assert roles_of(PPOHyperparameters(kl_ctl=0.1)) == ["actor", "ref"]
    assert roles_of(PPOHyperparameters(adv_estimator="gae")) == ["actor", "critic"]
    assert roles_of(PPOHyperparameters(adv_estimator="gae", kl_ctl=0.1)) == ["actor", "ref", "critic"]
    assert roles_of(PPOHyperparameters(adv_estimator="reinforce")) == ["actor"]


def test_reference_is_frozen_and_critic_has_a_value_head_both_on_the_actors_path_by_default():
    cfg = dataclasses.replace(trainer_config(ppo_n_minibatches=3), total_train_steps=10)
    actor, ref, critic = (engine_config(cfg, role, local_rank=0) for role in ("actor", "ref", "critic"))
    assert ref.model.path == critic.model.path == TINY_SFT
    assert (actor.trainable, ref.trainable, critic.trainable) == (True, False, True)
    assert (actor.value_head, ref.value_head, critic.value_head) == (False, False, True)
    assert critic.seed == 5 and actor.device == "cpu"
    assert actor.total_steps == 30  # the LR schedule counts optimizer steps: one per minibatch
    assert (actor.param_dtype, actor.reduce_dtype) == (None, "float32")  # None: chosen by device
    mixed = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, param_dtype="bfloat16"))
    assert engine_config(mixed, "actor", 0).param_dtype == "bfloat16"
    # A role's own path wins; the actor's config is not touched by the defaulting.
    own = dataclasses.replace(cfg, critic=ModelTrainEvalConfig(path="/models/critic"))
    assert engine_config(own, "critic", 0).model.path == "/models/critic"
    assert cfg.ref.path == ""
    with pytest.raises(ValueError, match="unknown model role 'rewards'"):
        engine_config(cfg, "rewards", 0)
    # A reward model is frozen, a value head, and has no default path (it must have been trained).
    with pytest.raises(ValueError, match="set reward.path=<training/main_rm.py's output>"):
        engine_config(cfg, "reward", 0)
    rm = engine_config(dataclasses.replace(cfg, reward=ModelTrainEvalConfig(path="/models/rm")), "reward", 0)
    assert (rm.model.path, rm.value_head, rm.trainable) == ("/models/rm", True, False)


def test_built_engines_freeze_the_reference_and_give_the_critic_one_output_per_position(msgs):
    batch = pack(msgs[:1])
    engines = build_engines(trainer_config(kl_ctl=0.1, adv_estimator="gae"), 0, roles=["actor", "ref", "critic"])
    try:
        assert sorted(engines) == ["actor", "critic", "ref"]
        ref = engines["ref"]
        assert ref.optimizer is None and not ref.model.training
        assert not any(p.requires_grad for p in ref.model.parameters())
        assert all(p.requires_grad for p in engines["actor"].model.parameters())
        with pytest.raises(RuntimeError, match="frozen engine"):
            ref.train_batch(batch, lambda out, mb, rows: out.sum(), lambda mb: 1.0)
        # Before any step the reference is the policy: its log-probs are the sampler's (T=1).
        stats = reference_logprobs(ref, batch, temperature=1.0)
        m = batch.loss_mask
        assert (batch.ref_logprobs[m] - batch.behav_logprobs[m]).abs().max() < 1e-5
        assert stats["model"] == "ref" and stats["n_tokens"] == batch.n_tokens
        out = engines["critic"].forward(batch, lambda output, mb: output[:, :-1, 0])
        assert out.shape == (batch.n_seqs, batch.input_ids.shape[1] - 1)
    finally:
        for role in ("critic", "ref", "actor"):  # the actor's engine owns the one-rank group
            engines[role].destroy()


def test_the_actor_engine_keeps_its_weights_in_the_configured_dtype():
    cfg = trainer_config()
    cfg = dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, dtype="bfloat16"))
    with open_engines(engine_config(cfg, "actor", 0)) as (engine,):
        assert next(engine.model.parameters()).dtype == torch.bfloat16


# ---- PPOActor: the deferral ------------------------------------------------------------------------


@pytest.mark.parametrize("n_minibatches", [2, 3])
def test_deferred_proximal_logprobs_give_the_same_parameters_and_stats(msgs, n_minibatches):
    """compute_logprobs leaves the first minibatch's rows to their train forward, which runs
    before any optimizer step: the step is the one without the deferral."""
    results = []
    for defer in (False, True):
        cfg = trainer_config(ppo_n_minibatches=n_minibatches)
        with open_engines(engine_config(cfg, "actor", 0)) as (engine,):
            trainer = PPOActor(engine, cfg.ppo)
            assert trainer.can_defer_prox  # no dropout; GRPO's advantages do not read the proximal
            trainer.can_defer_prox = defer
            batch = pack(msgs)
            inf = trainer.compute_logprobs(batch)
            first = first_minibatch_rows(batch, n_minibatches)
            assert inf["n_tokens"] == batch.n_tokens - (int(batch.loss_mask[first].sum()) if defer else 0)
            assert (batch.prox_logprobs[first].abs().sum() == 0) == defer  # really left out
            stats = trainer.train_step(batch)
            results.append((flat_params(engine), stats, batch.prox_logprobs.clone()))
    (w_full, s_full, p_full), (w_def, s_def, p_def) = results
    assert float((p_full - p_def).abs().max()) <= 1e-5  # the train forward filled the rows in
    # Adam moves a weight by about lr (1e-3) per step, and by a sign-like amount where a gradient is
    # near eps: the summation order of the two forwards shows there (1.2e-5 on an AVX2 host, 0 on
    # AVX-512). 2% of one step is far below what a wrong proximal term does (a whole step).
    assert float((w_full - w_def).abs().max()) <= 0.02 * 1e-3
    assert s_full.keys() == s_def.keys()
    for key, value in s_full.items():
        assert s_def[key] == pytest.approx(value, abs=1e-6), key


def test_a_deferral_belongs_to_the_batch_it_was_made_for(msgs):
    # Plain PPO on the behaviour log-probs: a batch trained without actor_inf has no proximal
    # log-probs, and must not inherit the deferral of a batch that had one.
    cfg = trainer_config(use_decoupled_loss=False, recompute_logprob=False)
    with open_engines(engine_config(cfg, "actor", 0)) as (engine,):
        trainer = PPOActor(engine, cfg.ppo)
        trainer.compute_logprobs(pack(msgs[:2]))
        other = pack(msgs[1:])
        stats = trainer.train_step(other)
    assert other.prox_logprobs is None and stats["n_tokens"] == other.n_tokens


def test_a_kl_reward_reads_the_proximal_logprobs_so_they_cannot_be_deferred(tiny):
    engine = SimpleNamespace(model=tiny[0])  # can_defer_prox reads only the model
    assert PPOActor(engine, PPOHyperparameters(kl_ctl=0.1)).can_defer_prox  # grpo: KL in the loss
    assert PPOActor(engine, PPOHyperparameters(adv_estimator="gae")).can_defer_prox
    assert not PPOActor(engine, PPOHyperparameters(adv_estimator="reinforce", kl_ctl=0.1)).can_defer_prox
    assert not PPOActor(engine, PPOHyperparameters(adv_estimator="gae", kl_ctl=0.1)).can_defer_prox


# ---- PPOCritic ---------------------------------------------------------------------------------------


def test_critic_values_cover_every_prediction_and_its_steps_pull_them_toward_the_returns(msgs):
    cfg = trainer_config(adv_estimator="gae", ppo_n_minibatches=2)
    batch = pack(msgs)
    m = batch.loss_mask
    with open_engines(engine_config(cfg, "critic", 0)) as (engine,):
        critic = PPOCritic(engine, cfg.ppo)
        stats = critic.compute_values(batch)
        assert batch.values.shape == (batch.n_seqs, batch.input_ids.shape[1] - 1)  # [N, T-1]
        assert (batch.values[~batch.attention_mask[:, 1:].bool()] == 0).all()
        assert stats["model"] == "critic" and "value_mean" in stats
        losses = []
        for _ in range(6):
            # A constant target: what the value loss does, not what GAE would make of it.
            batch.values, batch.advantages, batch.returns = None, torch.zeros_like(m, dtype=torch.float32), m.float()
            critic.compute_values(batch)
            step = critic.train_step(batch)
            losses.append(step["value_loss"])
        assert step["critic_lr"] == pytest.approx(2e-3) and step["critic_grad_norm"] > 0
    # Starting from a random head (values near 0, loss near ½), each step moves the values at
    # most value_eps_clip toward 1.
    assert 0.2 < losses[0] < 1.0, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.5 * losses[0], losses


def test_critic_train_computes_the_returns_itself_when_the_actor_did_not(msgs):
    cfg = trainer_config(adv_estimator="gae", ppo_n_minibatches=1)
    batch = pack(msgs[:1])
    with open_engines(engine_config(cfg, "critic", 0)) as (engine,):
        critic = PPOCritic(engine, cfg.ppo)
        critic.compute_values(batch)
        critic.train_step(batch)
    assert batch.returns is not None and batch.advantages is not None
    assert (batch.returns[~batch.loss_mask] == 0).all()


# ---- no poisoned weights -------------------------------------------------------------------------


def test_a_non_finite_loss_skips_the_optimizer_step_and_too_many_in_a_row_fail(msgs):
    """A behaviour log-prob of -1e30 is finite (it passes the trajectory checks) but makes the
    decoupled loss's importance weight infinite: the step must leave weights, Adam state and LR
    as they were, say so in the stats, and fail once more steps in a row than allowed did so."""
    cfg = trainer_config(ppo_n_minibatches=2)
    cfg.actor.optimizer.max_nonfinite_steps = 2
    with open_engines(engine_config(cfg, "actor", 0)) as (engine,):
        trainer = PPOActor(engine, cfg.ppo)
        poisoned = pack(msgs)
        poisoned.behav_logprobs[poisoned.loss_mask] = -1e30  # every row: both minibatches poisoned
        before, epoch = flat_params(engine), engine.lr_scheduler.last_epoch
        trainer.compute_logprobs(poisoned)
        stats = trainer.train_step(poisoned)
        assert stats["skipped_steps"] == 2
        assert torch.equal(flat_params(engine), before) and engine.lr_scheduler.last_epoch == epoch
        assert not engine.optimizer.state  # Adam never stepped

        healthy = pack(msgs)  # a good step resets the count and moves the weights
        trainer.compute_logprobs(healthy)
        assert trainer.train_step(healthy)["skipped_steps"] == 0
        assert torch.isfinite(flat_params(engine)).all() and not torch.equal(flat_params(engine), before)

        trainer.compute_logprobs(poisoned)
        trainer.train_step(poisoned)  # 2 in a row: still allowed
        poisoned_again = pack(msgs)
        poisoned_again.behav_logprobs[poisoned_again.loss_mask] = -1e30
        trainer.compute_logprobs(poisoned_again)
        with pytest.raises(FloatingPointError, match=r"3 optimizer steps in a row .*max_nonfinite_steps=2"):
            trainer.train_step(poisoned_again)


# ---- PPOActor: proximal log-probs approximated (ppo.prox_logp=loglinear) ---------------------------


def test_loglinear_runs_no_actor_inf_and_recompute_does():
    def names(**ppo):
        return default_graph(PPOHyperparameters(**ppo)).names()

    assert names() == ["actor_inf", "advantages", "actor_train"]
    assert names(prox_logp="loglinear") == ["advantages", "actor_train"]
    assert names(prox_logp="loglinear", kl_ctl=0.1) == ["ref_inf", "advantages", "actor_train"]
    assert names(use_decoupled_loss=False, recompute_logprob=False) == ["advantages", "actor_train"]
    assert names(use_decoupled_loss=False) == ["actor_inf", "advantages", "actor_train"]


def test_loglinear_with_one_minibatch_is_the_exact_step(msgs):
    """One minibatch: its own train forward (the proximal weights) gives the proximal log-probs,
    so skipping actor_inf changes nothing."""
    results = []
    for method in ("recompute", "loglinear"):
        cfg = trainer_config(ppo_n_minibatches=1, prox_logp=method)
        with open_engines(engine_config(cfg, "actor", 0)) as (engine,):
            trainer = PPOActor(engine, cfg.ppo)
            batch = pack(msgs)
            if method == "recompute":
                trainer.compute_logprobs(batch)
            stats = trainer.train_step(batch, version=0)
            results.append((flat_params(engine), stats))
    (w_a, s_a), (w_b, s_b) = results
    assert float((w_a - w_b).abs().max()) <= 1e-6
    for key, value in s_a.items():
        assert s_b[key] == pytest.approx(value, abs=1e-6), key


def test_loglinear_interpolates_each_tokens_proximal_logprob_by_its_version_lag(msgs):
    from realhf.impl.model.utils import ppo_functional as F
    from realhf.system.trainer import actor

    batch = pack(msgs)
    n = batch.n_seqs
    lag = torch.arange(n) % 4  # rows 0, 1, 2 and 3 versions stale
    batch.behav_versions = torch.where(batch.loss_mask, 10 - lag[:, None], torch.zeros_like(batch.behav_versions))
    cfg = PPOHyperparameters(prox_logp="loglinear", behav_imp_weight_cap=5.0)
    batch.advantages, batch.returns = actor.compute_advantages(batch, cfg)
    logits = torch.randn(n, batch.input_ids.shape[1], 258, generator=torch.Generator().manual_seed(3))
    rows = torch.arange(n)
    loss = actor.ActorLoss(batch, cfg, version=10)
    got = loss.for_rows(rows)(logits, batch, rows)  # a later minibatch: approximated

    logp, old = actor.token_logprobs(logits, batch), batch.behav_logprobs
    alpha = (lag / (lag + 1.0))[:, None]  # [N, 1]
    prox = old + alpha * (logp - old)
    per_token, _ = F.actor_loss_fn(
        logp, old, batch.advantages, cfg.eps_clip, batch.loss_mask,
        proximal_logprobs=prox, behav_imp_weight_cap=5.0, reduce="none",
    )  # fmt: skip
    want = actor.aggregation(cfg.loss_agg_mode).loss_sum(per_token, batch.loss_mask)
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    # Against the behaviour log-probs as the proximal ones (α = 0 everywhere): another loss.
    flat, _ = F.actor_loss_fn(
        logp, old, batch.advantages, cfg.eps_clip, batch.loss_mask,
        proximal_logprobs=old, behav_imp_weight_cap=5.0, reduce="none",
    )  # fmt: skip
    assert abs(float(want) - float(actor.aggregation(cfg.loss_agg_mode).loss_sum(flat, batch.loss_mask))) > 1e-3


def test_loglinear_without_the_steps_version_is_refused(msgs):
    from realhf.system.trainer import actor

    batch = pack(msgs)
    batch.advantages = torch.zeros_like(batch.behav_logprobs)
    with pytest.raises(ValueError, match="loglinear needs the step's version"):
        actor.ActorLoss(batch, PPOHyperparameters(prox_logp="loglinear"))
