"""The PPO math of the train step (realhf/system/trainer/actor.py): log-probs, advantages for each
estimator, and the actor/critic losses as callbacks of a real FSDPEngine at DP=1 (the engine
owns a one-rank gloo group). No processes, no sockets."""

import pytest
import torch

from helpers.fsdp_ranks import open_engines
from helpers.trajectories import TINY_SFT, load_rows, make_groups
from realhf.api.cli_args import ModelTrainEvalConfig, OptimizerConfig, PPOHyperparameters
from realhf.api.train_batch import TrainBatch
from realhf.api.trajectory import Trajectory
from realhf.impl.engine.fsdp_engine import FSDPEngineConfig
from realhf.impl.model.batching import micro_batches, minibatch_rows, pack_trajectories
from realhf.system.trainer import actor


def _config(lr: float = 1e-3, micro_batch_tokens: int = 0, **overrides) -> FSDPEngineConfig:
    optimizer = OptimizerConfig(lr=lr, gradient_clipping=1.0)
    return FSDPEngineConfig(
        model=ModelTrainEvalConfig(path=TINY_SFT, optimizer=optimizer),
        device="cpu",
        micro_batch_tokens=micro_batch_tokens,
        **{"shared_prompt": False, **overrides},
    )


def _batch(msgs) -> TrainBatch:
    return pack_trajectories([Trajectory.from_msg(m) for m in msgs], pad_id=0)


def _params(engine) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in engine.model.parameters()])


def _logprobs(engine, batch, temperature: float = 1.0) -> torch.Tensor:
    return engine.forward(batch, lambda out, mb: actor.token_logprobs(out, mb, temperature))  # [N, T-1]


def _actor_steps(engine, batch: TrainBatch, cfg: PPOHyperparameters) -> dict:
    """What PPOActor.train_step does without the deferral: advantages, one engine step per minibatch."""
    batch.advantages, batch.returns = actor.compute_advantages(batch, cfg)
    loss = actor.ActorLoss(batch, cfg)
    n_tokens, norms = 0.0, []
    for rows in minibatch_rows(batch, cfg.ppo_n_minibatches):
        out = engine.train_batch(batch.select(rows), loss.for_rows(rows), actor.loss_weight)
        n_tokens, norms = n_tokens + out["loss_weight"], norms + [out["grad_norm"]]
    return {**loss.stats.global_means(n_tokens), "n_tokens": n_tokens, "grad_norm": sum(norms) / len(norms)}


@pytest.fixture(scope="module")
def msgs4(tiny):
    model, tok = tiny
    return make_groups(model, tok, load_rows(4), group_size=4)


# ---- log-probs -------------------------------------------------------------------------------------


def test_token_logprobs_are_the_samplers_at_the_generation_temperature_and_zero_on_padding(tiny):
    model, tok = tiny
    # Two prompts: rows of different lengths, so the shorter ones are padded.
    batch = _batch(make_groups(model, tok, load_rows(2), group_size=2))
    assert (batch.attention_mask == 0).any()
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [N, T, V]
    # The sampler's log-probs at T are log_softmax(logits / T) (SGLang's convention).
    want = torch.log_softmax(logits[:, :-1] / 0.7, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    got = actor.token_logprobs(logits, batch, temperature=0.7)  # [N, T-1]
    m, pad = batch.loss_mask, ~batch.attention_mask[:, 1:].bool()
    assert (got[m] - want[m]).abs().max() < 1e-5
    assert (got[pad] == 0).all()
    at_t1 = actor.token_logprobs(logits, batch, temperature=1.0)
    assert (at_t1[m] - batch.behav_logprobs[m]).abs().max() < 1e-5  # make_groups samples at T=1
    assert (at_t1[m] - got[m]).abs().max() > 1e-2  # the temperature really is applied
    # Greedy (T=0) log-probs are not a distribution: treated as T=1, not a division by 0.
    assert torch.equal(actor.token_logprobs(logits, batch, temperature=0.0), at_t1)


def test_engine_forward_in_length_sorted_micro_batches_matches_the_plain_forward_row_by_row(tiny, msgs4):
    model, _ = tiny
    batch = _batch(msgs4[:3])
    with open_engines(_config(micro_batch_tokens=100)) as (engine,):
        assert len(micro_batches(batch, torch.arange(batch.n_seqs), 100)) > 1
        got = _logprobs(engine, batch)
    with torch.no_grad():
        whole = actor.token_logprobs(
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, batch
        )
    assert torch.allclose(got, whole, atol=1e-5)


def test_dropout_is_detected_so_the_train_forward_is_not_used_as_proximal(tiny):
    model, _ = tiny
    assert not actor.has_dropout(model)
    assert actor.has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))


# ---- advantages ------------------------------------------------------------------------------------


def _ragged_batch() -> TrainBatch:
    """Rows of different lengths, trained tokens with holes (inserted feedback), one row with no
    trained token at all; random log-probs of the proximal, reference and critic kinds."""
    g = torch.Generator().manual_seed(0)
    n, width = 6, 12
    lengths = torch.tensor([12, 3, 7, 1, 9, 5])
    cols = torch.arange(width - 1)[None, :]  # [1, T-1]
    loss_mask = (cols < lengths[:, None] - 1) & (torch.rand(n, width - 1, generator=g) < 0.8)  # [N, T-1]
    loss_mask[3] = False
    return TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        loss_mask=loss_mask,
        behav_logprobs=-torch.rand(n, width - 1, generator=g),
        rewards=torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0]),
        group_ids=torch.arange(n) // 2,
        prox_logprobs=-torch.rand(n, width - 1, generator=g),
        ref_logprobs=-torch.rand(n, width - 1, generator=g),
        values=torch.randn(n, width - 1, generator=g),
    )


def _reference_gae(batch: TrainBatch, cfg: PPOHyperparameters, values: bool):
    """GAE one sample at a time in plain Python: a sample's steps are its trained tokens in order;
    reward −kl_ctl·(prox − ref) at each, plus the shaped score at the last; V = batch.values (or
    0) at each step and 0 after the last; 0 elsewhere and for a sample without trained tokens."""
    adv = torch.zeros_like(batch.behav_logprobs, dtype=torch.float64)
    ret = torch.zeros_like(adv)
    for i in range(batch.n_seqs):
        steps = batch.loss_mask[i].nonzero().flatten().tolist()
        if not steps:
            continue
        score = (float(batch.rewards[i]) + cfg.reward_output_bias) * cfg.reward_output_scaling
        rewards = [-cfg.kl_ctl * float(batch.prox_logprobs[i, t] - batch.ref_logprobs[i, t]) for t in steps]
        rewards[-1] += score
        v = [float(batch.values[i, t]) if values else 0.0 for t in steps] + [0.0]
        running = 0.0
        for k in reversed(range(len(steps))):
            delta = rewards[k] + cfg.discount * v[k + 1] - v[k]
            running = delta + cfg.discount * cfg.gae_lambda * running
            adv[i, steps[k]], ret[i, steps[k]] = running, running + v[k]
    return adv, ret


def test_grpo_gives_every_trained_token_its_group_normalised_reward():
    batch = _ragged_batch()
    batch.rewards = torch.tensor([1.0, -1.0, 1.0, 1.0, 3.0, 1.0])  # groups {0,1} {2,3} {4,5}
    m = batch.loss_mask
    adv, returns = actor.compute_advantages(batch, PPOHyperparameters(adv_estimator="grpo"))
    # Group {0,1}: mean 0, population std 1 → ±1; group {2,3}: std 0 → 0; group {4,5}: ±1.
    per_sample = torch.tensor([1.0, -1.0, 0.0, 0.0, 1.0, -1.0])
    assert torch.allclose(adv, torch.where(m, per_sample[:, None].expand_as(m), torch.zeros(())), atol=1e-5)
    assert torch.equal(returns, adv)  # no critic reads them
    # dr_grpo: the mean only.
    batch.rewards = torch.tensor([1.0, -1.0, 1.0, 1.0, 5.0, 1.0])
    adv, _ = actor.compute_advantages(batch, PPOHyperparameters(adv_estimator="dr_grpo"))
    per_sample = torch.tensor([1.0, -1.0, 0.0, 0.0, 2.0, -2.0])  # 5 − mean(5, 1), not divided by the std
    assert torch.allclose(adv, torch.where(m, per_sample[:, None].expand_as(m), torch.zeros(())), atol=1e-5)


def test_reinforce_gives_each_trained_token_its_discounted_sequence_score(tiny):
    model, tok = tiny
    batch = _batch(make_groups(model, tok, load_rows(2), group_size=2))
    cfg = PPOHyperparameters(
        adv_estimator="reinforce",
        adv_norm=False,
        discount=1.0,
        gae_lambda=1.0,
        reward_output_scaling=2.0,
        reward_output_bias=0.5,
    )
    adv, returns = actor.compute_advantages(batch, cfg)
    for i in range(batch.n_seqs):
        m = batch.loss_mask[i]
        score = (float(batch.rewards[i]) + 0.5) * 2.0
        assert torch.allclose(adv[i][m], torch.full((int(m.sum()),), score))
        assert (adv[i][~m] == 0).all()
    assert torch.equal(returns, adv)  # zero values: returns = advantages
    cfg.discount = 0.5
    adv, _ = actor.compute_advantages(batch, cfg)
    last = batch.loss_mask[0].nonzero().flatten()[-2:]
    assert adv[0, last].tolist() == pytest.approx([0.5 * 3.0, 3.0])


@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
@pytest.mark.parametrize("estimator", ["reinforce", "gae"])
def test_gae_and_reinforce_on_a_ragged_batch_match_a_per_sample_reference(kl_ctl, estimator):
    # The padded batch goes through GAE in one masked pass; reinforce ignores batch.values.
    batch = _ragged_batch()
    cfg = PPOHyperparameters(
        adv_estimator=estimator,
        adv_norm=False,
        kl_ctl=kl_ctl,
        discount=0.9,
        gae_lambda=0.8,
        reward_output_scaling=2.0,
        reward_output_bias=0.5,
    )
    adv, returns = actor.compute_advantages(batch, cfg)
    want_adv, want_ret = _reference_gae(batch, cfg, values=estimator == "gae")
    assert torch.allclose(adv.double(), want_adv, atol=1e-5)
    assert torch.allclose(returns.double(), want_ret, atol=1e-5)
    assert (adv[~batch.loss_mask] == 0).all() and (returns[~batch.loss_mask] == 0).all()


def test_gae_without_critic_values_names_critic_inf():
    batch = _ragged_batch()
    batch.values = None
    with pytest.raises(ValueError, match="adv_estimator=gae needs the critic's values: run critic_inf"):
        actor.compute_advantages(batch, PPOHyperparameters(adv_estimator="gae"))


def test_a_kl_reward_needs_reference_logprobs():
    batch = _ragged_batch()
    batch.ref_logprobs = None
    with pytest.raises(ValueError, match="kl_ctl > 0 needs reference log-probs: run ref_inf"):
        actor.compute_advantages(batch, PPOHyperparameters(adv_estimator="reinforce", kl_ctl=0.1))


@pytest.mark.parametrize("estimator", ["grpo", "reinforce", "gae"])
def test_adv_norm_whitens_the_trained_tokens_and_leaves_returns_alone(estimator):
    batch = _ragged_batch()
    cfg = PPOHyperparameters(adv_estimator=estimator, discount=0.9, gae_lambda=0.8)
    raw, raw_returns = actor.compute_advantages(batch, cfg)
    cfg.adv_norm = True
    adv, returns = actor.compute_advantages(batch, cfg)
    m = batch.loss_mask
    assert float(adv[m].double().mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[m].double().std(unbiased=False)) == pytest.approx(1.0, abs=1e-3)
    assert (adv[~m] == 0).all()
    assert torch.equal(returns, raw_returns)  # the critic's targets are not normalised
    # An affine map of the raw advantages: the order of tokens is kept.
    assert torch.equal(torch.argsort(adv[m], stable=True), torch.argsort(raw[m], stable=True))


# ---- the losses through a real engine -----------------------------------------------------------


def test_a_ppo_step_widens_the_likelihood_gap_between_rewarded_and_unrewarded_answers(msgs4):
    batch = _batch(msgs4)
    cfg = PPOHyperparameters(ppo_n_minibatches=2)
    with open_engines(_config(lr=1e-4)) as (engine,):  # the NOTES recipe
        before = _logprobs(engine, batch).mul(batch.loss_mask).sum(1)  # [N]
        batch.prox_logprobs = _logprobs(engine, batch)
        stats = _actor_steps(engine, batch, cfg)
        change = _logprobs(engine, batch).mul(batch.loss_mask).sum(1) - before  # [N]
    good = batch.rewards > 0
    # Wrong answers differ from the right ones only in the final number: that token is pushed
    # down hard, while the (already likely) rewarded answers about keep their likelihood (how much
    # they lose depends on which groups share an optimizer step: -0.02 to -0.08 seen).
    assert change[~good].mean() < -0.3
    assert change[good].mean() > -0.1
    assert change[good].mean() - change[~good].mean() > 0.3
    assert stats["n_tokens"] == batch.n_tokens
    assert 0 <= stats["clip_fraction"] <= 1 and stats["grad_norm"] > 0
    assert stats["importance_ratio"] == pytest.approx(1.0, abs=0.05)  # the first minibatch's is exactly 1


def test_decoupled_loss_without_proximal_logprobs_is_refused_with_a_hint(msgs4):
    batch = _batch(msgs4[:1])
    batch.advantages = torch.zeros_like(batch.behav_logprobs)
    with pytest.raises(ValueError, match="use_decoupled_loss needs proximal log-probs: run actor_inf"):
        actor.ActorLoss(batch, PPOHyperparameters(use_decoupled_loss=True))


def test_kl_loss_needs_reference_logprobs_and_vanishes_when_ref_is_the_policy(msgs4):
    batch = _batch(msgs4[:2])
    cfg = PPOHyperparameters(kl_ctl=0.1, ppo_n_minibatches=1)
    with open_engines(_config()) as (engine,):
        batch.prox_logprobs = _logprobs(engine, batch)
        batch.advantages, batch.returns = actor.compute_advantages(batch, cfg)
        with pytest.raises(ValueError, match="kl_ctl > 0 needs reference log-probs: run ref_inf"):
            actor.ActorLoss(batch, cfg)
        batch.ref_logprobs = batch.prox_logprobs.clone()
        stats = _actor_steps(engine, batch, cfg)
    assert abs(stats["kl_ref"]) < 1e-6  # k3 of identical policies is exactly 0


@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
def test_micro_batched_train_step_gives_the_update_of_whole_minibatches(msgs4, kl_ctl):
    """Gradients accumulated over length-sorted micro-batches = one forward per minibatch."""
    results = []
    for budget in (0, 90):
        batch = _batch(msgs4)
        cfg = PPOHyperparameters(ppo_n_minibatches=2, kl_ctl=kl_ctl)
        assert budget == 0 or len(micro_batches(batch, torch.arange(8), budget)) > 1
        with open_engines(_config(micro_batch_tokens=budget)) as (engine,):
            batch.prox_logprobs = _logprobs(engine, batch)
            batch.ref_logprobs = batch.prox_logprobs - 0.05
            stats = _actor_steps(engine, batch, cfg)
            results.append((_params(engine), stats))
    (w_whole, s_whole), (w_mb, s_mb) = results
    # Float summation order differs; Adam's g/sqrt(v) magnifies that on tiny gradients, still
    # far below one step of lr 1e-3 (2.1e-5 seen).
    assert torch.allclose(w_whole, w_mb, atol=5e-5), float((w_whole - w_mb).abs().max())
    for key in ("loss", "importance_ratio", "approx_kl", "clip_fraction", "kl_ref", "grad_norm", "n_tokens"):
        assert s_whole[key] == pytest.approx(s_mb[key], rel=1e-4, abs=1e-6), key


def test_critic_loss_needs_values_and_returns_and_pulls_values_toward_the_returns(msgs4):
    batch = _batch(msgs4[:2])
    cfg = PPOHyperparameters(adv_estimator="gae", ppo_n_minibatches=1, value_eps_clip=0.2)
    with pytest.raises(ValueError, match="critic_train needs the values of critic_inf"):
        actor.CriticLoss(batch, cfg)
    with open_engines(_config(lr=1e-3, value_head=True)) as (critic,):
        batch.values = critic.forward(batch, actor.token_values)  # [N, T-1]
        batch.advantages, batch.returns = actor.compute_advantages(batch, cfg)
        loss = actor.CriticLoss(batch, cfg)
        rows = torch.arange(batch.n_seqs)
        out = critic.train_batch(batch, loss.for_rows(rows), actor.loss_weight)
        stats = loss.stats.global_means(out["loss_weight"])
        after = critic.forward(batch, actor.token_values)
    m = batch.loss_mask
    # The step's loss is ½ E[(V − R)²] at the old values (V = V_old before the step).
    assert stats["value_loss"] == pytest.approx(0.5 * float(((batch.values - batch.returns)[m] ** 2).mean()), rel=1e-4)
    assert stats["value_abs_error"] == pytest.approx(float((batch.values - batch.returns)[m].abs().mean()), rel=1e-4)
    assert stats["value_clip_fraction"] == 0.0  # nothing clips before the first step moved anything
    assert float((after - batch.returns)[m].abs().mean()) < float((batch.values - batch.returns)[m].abs().mean())
