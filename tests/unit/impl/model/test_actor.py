"""The trainer's step on the real tiny model (realhf/impl/model/actor.py): log-probs, the PPO
step, advantages, the KL to the reference, proximal log-probs and micro-batches. No processes,
no sockets."""

import pytest
import torch

from realhf.api.cli_args import OptimizerConfig, PPOHyperparameters
from realhf.api.trajectory import Trajectory
from realhf.impl.model import actor
from realhf.impl.model.batching import TrainBatch, pack_trajectories
from realhf.impl.model.optim import make_optimizer

from helpers.trajectories import load_rows, load_tiny, make_groups


def test_recomputed_logprobs_equal_the_samplers_at_the_generation_temperature(tiny):
    model, tok = tiny
    traj = Trajectory.from_msg(make_groups(model, tok, load_rows(2), group_size=2)[0])
    batch = pack_trajectories([traj], pad_id=0)
    # The sampler's log-probs at T are log_softmax(logits / T) (SGLang's convention).
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        want = torch.log_softmax(logits / 0.7, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    got = actor.inference_logprobs(model, batch, temperature=0.7)
    m = batch.loss_mask
    assert (got[m] - want[m]).abs().max() < 1e-5
    at_t1 = actor.inference_logprobs(model, batch, temperature=1.0)
    assert (at_t1[m] - batch.behav_logprobs[m]).abs().max() < 1e-5
    assert (at_t1[m] - got[m]).abs().max() > 1e-2  # the temperature really is applied


def test_a_ppo_step_widens_the_likelihood_gap_between_rewarded_and_unrewarded_answers(tiny):
    _, tok = tiny
    model, _ = load_tiny()  # a private copy: this test trains it
    trajs = [Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(4), group_size=4)]
    batch = pack_trajectories(trajs, pad_id=0)
    cfg = PPOHyperparameters(ppo_n_minibatches=2)
    opt, sched = make_optimizer(model, OptimizerConfig(lr=1e-4), total_steps=0)  # the NOTES recipe
    before = actor.inference_logprobs(model, batch).mul(batch.loss_mask).sum(1)
    batch.prox_logprobs = actor.inference_logprobs(model, batch)
    stats = actor.ppo_train_step(model, opt, sched, batch, cfg, gradient_clipping=1.0)
    change = actor.inference_logprobs(model, batch).mul(batch.loss_mask).sum(1) - before
    good = batch.rewards > 0
    # Wrong answers differ from the right ones only in the final number: that token is pushed
    # down hard, while the (already likely) rewarded answers keep their likelihood.
    assert change[~good].mean() < -0.3
    assert change[good].mean() > -0.05
    assert change[good].mean() - change[~good].mean() > 0.3
    assert stats["n_tokens"] == batch.n_tokens
    assert 0 <= stats["clip_fraction"] <= 1 and stats["grad_norm"] > 0


def test_decoupled_loss_without_proximal_logprobs_is_refused_with_a_hint(tiny):
    model, tok = tiny
    batch = pack_trajectories([Trajectory.from_msg(make_groups(model, tok, load_rows(1), 2)[0])], pad_id=0)
    opt, sched = make_optimizer(model, OptimizerConfig(), total_steps=0)
    with pytest.raises(ValueError, match="use_decoupled_loss needs proximal log-probs: run actor_inf"):
        actor.ppo_train_step(model, opt, sched, batch, PPOHyperparameters(use_decoupled_loss=True), 1.0)


def test_without_group_norm_gae_gives_each_trained_token_its_discounted_sequence_score(tiny):
    model, tok = tiny
    trajs = [Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(2), group_size=2)]
    batch = pack_trajectories(trajs, pad_id=0)
    cfg = PPOHyperparameters(group_adv_norm=False, adv_norm=False, discount=1.0, gae_lambda=1.0,
                             reward_output_scaling=2.0, reward_output_bias=0.5)
    adv = actor.compute_advantages(batch, cfg)
    for i in range(batch.n_seqs):
        m = batch.loss_mask[i]
        score = (float(batch.rewards[i]) + 0.5) * 2.0
        assert torch.allclose(adv[i][m], torch.full((int(m.sum()),), score))
        assert (adv[i][~m] == 0).all()
    cfg.discount = 0.5
    adv = actor.compute_advantages(batch, cfg)
    last = batch.loss_mask[0].nonzero().flatten()[-2:]
    assert adv[0, last].tolist() == pytest.approx([0.5 * 3.0, 3.0])


def _reference_gae_advantages(batch, cfg):
    """compute_advantages without group norm, one sample at a time in plain Python: a sample's
    steps are its trained tokens in order; reward −kl_ctl·(prox − ref) at each, plus the shaped
    score at the last; GAE with zero values; 0 elsewhere and for a sample without trained tokens."""
    out = torch.zeros_like(batch.behav_logprobs, dtype=torch.float64)
    for i in range(batch.n_seqs):
        steps = batch.loss_mask[i].nonzero().flatten().tolist()
        if not steps:
            continue
        score = (float(batch.rewards[i]) + cfg.reward_output_bias) * cfg.reward_output_scaling
        rewards = [-cfg.kl_ctl * float(batch.prox_logprobs[i, t] - batch.ref_logprobs[i, t]) for t in steps]
        rewards[-1] += score
        running = 0.0
        for k in reversed(range(len(steps))):
            running = rewards[k] + cfg.discount * cfg.gae_lambda * running
            out[i, steps[k]] = running
    return out


@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
def test_gae_advantages_on_a_ragged_batch_match_a_per_sample_reference(kl_ctl):
    # Rows of different lengths, trained tokens with holes (inserted feedback), one row with no
    # trained token at all; the padded batch goes through GAE in one masked pass.
    g = torch.Generator().manual_seed(0)
    n, width = 6, 12
    lengths = torch.tensor([12, 3, 7, 1, 9, 5])
    cols = torch.arange(width - 1)[None, :]  # [1, T-1]
    loss_mask = (cols < lengths[:, None] - 1) & (torch.rand(n, width - 1, generator=g) < 0.8)  # [N, T-1]
    loss_mask[3] = False
    batch = TrainBatch(
        input_ids=torch.zeros(n, width, dtype=torch.long),
        attention_mask=(torch.arange(width)[None, :] < lengths[:, None]).long(),
        loss_mask=loss_mask,
        behav_logprobs=-torch.rand(n, width - 1, generator=g),
        rewards=torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, 1.0]),
        group_ids=torch.arange(n) // 2,
        prox_logprobs=-torch.rand(n, width - 1, generator=g),
        ref_logprobs=-torch.rand(n, width - 1, generator=g),
    )
    cfg = PPOHyperparameters(group_adv_norm=False, adv_norm=False, kl_ctl=kl_ctl, discount=0.9, gae_lambda=0.8,
                             reward_output_scaling=2.0, reward_output_bias=0.5)
    adv = actor.compute_advantages(batch, cfg)
    assert torch.allclose(adv.double(), _reference_gae_advantages(batch, cfg), atol=1e-6)
    assert (adv[~loss_mask] == 0).all()


def test_kl_to_the_reference_needs_reference_logprobs_and_vanishes_when_ref_is_the_policy(tiny):
    _, tok = tiny
    model, _ = load_tiny()
    batch = pack_trajectories([Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(2), 2)], 0)
    cfg = PPOHyperparameters(kl_ctl=0.1, ppo_n_minibatches=1)
    opt, sched = make_optimizer(model, OptimizerConfig(), total_steps=0)
    batch.prox_logprobs = actor.inference_logprobs(model, batch)
    with pytest.raises(ValueError, match="kl_ctl > 0 needs reference log-probs: run ref_inf"):
        actor.ppo_train_step(model, opt, sched, batch, cfg, 1.0)
    batch.ref_logprobs = batch.prox_logprobs.clone()
    stats = actor.ppo_train_step(model, opt, sched, batch, cfg, 1.0)
    assert abs(stats["kl_ref"]) < 1e-6  # k3 of identical policies is exactly 0


@pytest.mark.parametrize("n_minibatches", [1, 2, 3])
def test_proximal_logprobs_from_the_first_minibatch_forward_give_the_same_update(tiny, n_minibatches):
    """actor_inf may leave out the first minibatch: before the first optimizer step the train
    forward computes exactly the proximal log-probs. Same weights after the step, same stats."""
    _, tok = tiny
    msgs = make_groups(tiny[0], tok, load_rows(3), group_size=4)
    results = []
    for deferred in (False, True):
        torch.manual_seed(0)
        model, _ = load_tiny()
        batch = pack_trajectories([Trajectory.from_msg(m) for m in msgs], pad_id=0)
        cfg = PPOHyperparameters(ppo_n_minibatches=n_minibatches)
        opt, sched = make_optimizer(model, OptimizerConfig(lr=1e-3), total_steps=0)
        first = actor.first_minibatch_rows(batch.n_seqs, n_minibatches)
        rest = torch.tensor([r for r in range(batch.n_seqs) if r not in set(first.tolist())], dtype=torch.long)
        batch.prox_logprobs = actor.inference_logprobs(model, batch, rows=rest if deferred else None)
        if deferred:
            assert batch.prox_logprobs[first].abs().sum() == 0  # really left out
        stats = actor.ppo_train_step(model, opt, sched, batch, cfg, 1.0, prox_from_first_forward=deferred)
        results.append((torch.cat([p.detach().flatten() for p in model.parameters()]), stats, batch.prox_logprobs))
    (w_full, s_full, p_full), (w_def, s_def, p_def) = results
    assert torch.allclose(p_full, p_def, atol=1e-5)
    assert torch.allclose(w_full, w_def, atol=1e-6)
    assert s_full["importance_ratio"] == pytest.approx(s_def["importance_ratio"], abs=1e-5)


def test_length_sorted_inference_matches_the_plain_forward_row_by_row(tiny):
    model, tok = tiny
    batch = pack_trajectories([Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(3), 4)], 0)
    sorted_mb = actor.inference_logprobs(model, batch, micro_batch_tokens=100)
    with torch.no_grad():
        whole = actor.compute_logprobs(model, batch)
    assert torch.allclose(sorted_mb, whole, atol=1e-5)


def test_micro_batches_keep_every_row_once_in_order_of_length_within_the_token_budget(tiny):
    model, tok = tiny
    batch = pack_trajectories([Trajectory.from_msg(m) for m in make_groups(model, tok, load_rows(4), 4)], 0)
    rows = torch.arange(1, batch.n_seqs)  # any subset
    lengths = batch.attention_mask.sum(dim=1)
    chunks = actor.micro_batches(batch, rows, max_tokens=120)
    assert len(chunks) > 1
    assert sorted(torch.cat(chunks).tolist()) == rows.tolist()
    flat = torch.cat(chunks)
    assert (lengths[flat][1:] >= lengths[flat][:-1]).all()
    for c in chunks:
        assert len(c) == 1 or len(c) * int(lengths[c].max()) <= 120
    assert [c.tolist() for c in actor.micro_batches(batch, rows, 0)] == [rows.tolist()]


@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
def test_micro_batched_train_step_gives_the_update_of_whole_minibatches(tiny, kl_ctl):
    """Gradients accumulated over length-sorted micro-batches = one forward per minibatch."""
    _, tok = tiny
    msgs = make_groups(tiny[0], tok, load_rows(4), group_size=4)
    results = []
    for budget in (0, 90):
        torch.manual_seed(0)
        model, _ = load_tiny()
        batch = pack_trajectories([Trajectory.from_msg(m) for m in msgs], pad_id=0)
        cfg = PPOHyperparameters(ppo_n_minibatches=2, micro_batch_tokens=budget, kl_ctl=kl_ctl)
        assert budget == 0 or len(actor.micro_batches(batch, torch.arange(8), budget)) > 1
        opt, sched = make_optimizer(model, OptimizerConfig(lr=1e-3), total_steps=0)
        batch.prox_logprobs = actor.inference_logprobs(model, batch, micro_batch_tokens=budget)
        batch.ref_logprobs = batch.prox_logprobs - 0.05
        stats = actor.ppo_train_step(model, opt, sched, batch, cfg, 1.0)
        results.append((torch.cat([p.detach().flatten() for p in model.parameters()]), stats))
    (w_whole, s_whole), (w_mb, s_mb) = results
    # Float summation order differs; Adam's g/sqrt(v) magnifies that on tiny gradients, still
    # far below one step of lr 1e-3.
    assert torch.allclose(w_whole, w_mb, atol=2e-5)
    for key in ("loss", "importance_ratio", "approx_kl", "clip_fraction", "kl_ref", "grad_norm", "n_tokens"):
        assert s_whole[key] == pytest.approx(s_mb[key], rel=1e-4, abs=1e-6), key


def test_dropout_is_detected_so_the_train_forward_is_not_used_as_proximal(tiny):
    model, _ = tiny
    assert not actor.has_dropout(model)
    assert actor.has_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1)))
