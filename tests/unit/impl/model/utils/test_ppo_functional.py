"""Specification of realhf.impl.model.utils.ppo_functional (docs/architecture.md §7).

Hand-computed numbers are derived in the comments next to them; the random tests compare
against slow references written as plain Python loops over tokens.
"""

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from realhf.api.agent import shape_reward  # the one definition, agent and trainer alike
from realhf.impl.model.utils.ppo_functional import (
    actor_loss_fn,
    gae_masked,
    grpo_advantages,
    kl_estimate,
    masked_normalization,
    rewards_with_kl,
)

T = torch.tensor


def close(a, b, tol=1e-6):
    return torch.allclose(
        torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64), atol=tol, rtol=0
    )


# =============================================================================================
# Slow references: one token at a time, plain Python floats.
# =============================================================================================


def reference_actor_loss(logp, old, adv, mask, eps, eps_high, c_clip, prox, cap):
    total, count = 0.0, 0
    for i in range(len(logp)):
        if not mask[i]:
            continue
        count += 1
        den = old[i] if prox is None else prox[i]
        r = math.exp(logp[i] - den)
        clipped = min(max(r, 1 - eps), 1 + eps_high)
        loss = max(-adv[i] * r, -adv[i] * clipped)
        if c_clip is not None and adv[i] < 0:
            loss = min(loss, c_clip * abs(adv[i]))
        if prox is not None:
            w = math.exp(prox[i] - old[i])
            if cap is not None and w > cap:
                w = 0.0
            loss *= w
        total += loss
    return total / max(count, 1)


def reference_gae(rewards, values, mask, bootstrap_values, gamma, lam):
    """Row by row: a row's steps are its masked positions; the value after its last step is its
    bootstrap value. Returns padded advantages and returns, 0 off the mask."""
    advantages = [[0.0] * len(row) for row in rewards]
    returns = [[0.0] * len(row) for row in rewards]
    for b, row_mask in enumerate(mask):
        steps = [t for t, m in enumerate(row_mask) if m]
        next_adv, next_value = 0.0, bootstrap_values[b]
        for t in reversed(steps):
            delta = rewards[b][t] + gamma * next_value - values[b][t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b][t]
            advantages[b][t] = next_adv
            returns[b][t] = next_adv + values[b][t]
    return advantages, returns


# =============================================================================================
# GAE
# =============================================================================================

# Two rows of 3 and 2 steps, right-padded (the padding entries, 9.0, must not matter).
GAE_REWARDS = [[0.1, -0.2, 1.0], [0.5, 0.0, 9.0]]
GAE_VALUES = [[0.3, 0.2, 0.1], [0.0, 0.6, 9.0]]
GAE_MASK = [[True, True, True], [True, True, False]]


def test_gae_matches_hand_computed_reference_without_bootstrap():
    # γ = 0.9, λ = 0.5, γλ = 0.45; no bootstrap, so the value after the last step is 0.
    # Row 1: δ2 = 1.0 + 0 − 0.1 = 0.9                       A2 = 0.9
    #        δ1 = −0.2 + 0.9·0.1 − 0.2 = −0.31             A1 = −0.31 + 0.45·0.9   = 0.095
    #        δ0 = 0.1 + 0.9·0.2 − 0.3 = −0.02              A0 = −0.02 + 0.45·0.095 = 0.02275
    # Row 2: δ1 = 0.0 + 0 − 0.6 = −0.6                       A1 = −0.6
    #        δ0 = 0.5 + 0.9·0.6 − 0.0 = 1.04               A0 = 1.04 − 0.45·0.6    = 0.77
    # returns = A + V: [0.32275, 0.295, 1.0 | 0.77, 0.0]; 0 on the padding.
    adv, ret = gae_masked(T(GAE_REWARDS), T(GAE_VALUES), T(GAE_MASK), gamma=0.9, lam=0.5)
    assert close(adv, [[0.02275, 0.095, 0.9], [0.77, -0.6, 0.0]])
    assert close(ret, [[0.32275, 0.295, 1.0], [0.77, 0.0, 0.0]])


def test_gae_bootstraps_from_the_value_after_the_last_step():
    # Same data, row 1 bootstrapped from the value 0.4 after its last step, row 2 not (0):
    # Row 1: δ2 = 1.0 + 0.9·0.4 − 0.1 = 1.26                A2 = 1.26
    #        A1 = −0.31 + 0.45·1.26 = 0.257                A0 = −0.02 + 0.45·0.257 = 0.09565
    # Row 2 is unchanged: [0.77, −0.6].
    adv, ret = gae_masked(
        T(GAE_REWARDS), T(GAE_VALUES), T(GAE_MASK), gamma=0.9, lam=0.5, bootstrap_values=T([0.4, 0.0])
    )
    assert close(adv, [[0.09565, 0.257, 1.26], [0.77, -0.6, 0.0]])
    assert close(ret, [[0.39565, 0.457, 1.36], [0.77, 0.0, 0.0]])


def test_gae_with_lambda_one_and_gamma_one_is_reward_to_go_minus_value():
    # γ = λ = 1 telescopes: A_t = Σ_{k≥t} r_k − V_t (no bootstrap).
    adv, _ = gae_masked(T([[1.0, 2.0, 3.0]]), T([[0.5, 0.25, 0.0]]), T([[True] * 3]), gamma=1.0, lam=1.0)
    assert close(adv, [[6.0 - 0.5, 5.0 - 0.25, 3.0 - 0.0]])


def test_gae_skips_unmasked_positions_inside_a_row():
    # Steps at columns 0 and 3 (columns 1–2: inserted feedback, not trained). γ = 0.5, λ = 1,
    # V = 0: A3 = r3 = 2, A0 = r0 + 0.5·A3 = 1 + 1 = 2; the skipped columns' rewards do not count.
    adv, _ = gae_masked(T([[1.0, 7.0, 7.0, 2.0]]), torch.zeros(1, 4), T([[True, False, False, True]]), 0.5, 1.0)
    assert close(adv, [[2.0, 0.0, 0.0, 2.0]])


def test_gae_matches_per_sequence_reference_on_random_ragged_batches():
    rng = random.Random(0)
    for _ in range(50):
        n_rows, width = rng.randint(1, 6), rng.randint(1, 9)
        # Ragged: each row is a prompt-free output of its own length, with holes, then padding.
        mask = []
        for _ in range(n_rows):
            length = rng.randint(0, width)
            mask.append([t < length and rng.random() < 0.8 for t in range(width)])
        rewards = [[rng.uniform(-1, 1) for _ in range(width)] for _ in range(n_rows)]
        values = [[rng.uniform(-1, 1) for _ in range(width)] for _ in range(n_rows)]
        boot = [rng.uniform(-1, 1) if rng.random() < 0.5 else 0.0 for _ in range(n_rows)]
        gamma, lam = rng.uniform(0.5, 1.0), rng.uniform(0.0, 1.0)
        adv, ret = gae_masked(
            T(rewards, dtype=torch.float64),
            T(values, dtype=torch.float64),
            T(mask),
            gamma,
            lam,
            bootstrap_values=T(boot, dtype=torch.float64),
        )
        ref_adv, ref_ret = reference_gae(rewards, values, mask, boot, gamma, lam)
        assert close(adv, ref_adv, 1e-12) and close(ret, ref_ret, 1e-12)


def test_gae_rejects_inputs_of_different_shapes():
    with pytest.raises(ValueError, match="one \\[B, L\\] shape"):
        gae_masked(T(GAE_REWARDS), T(GAE_VALUES)[:, :2], T(GAE_MASK), 0.9, 0.5)


# =============================================================================================
# Actor loss: hand-computed cases
# =============================================================================================


def loss_of(logp, old, adv, eps=0.2, mask=None, **kw):
    logp, old, adv = T(logp, dtype=torch.float64), T(old, dtype=torch.float64), T(adv, dtype=torch.float64)
    mask = torch.ones_like(logp, dtype=torch.bool) if mask is None else T(mask)
    for key in ("proximal_logprobs",):
        if key in kw:
            kw[key] = T(kw[key], dtype=torch.float64)
    return actor_loss_fn(logp, old, adv, eps, mask, **kw)


def test_on_policy_loss_is_minus_the_mean_advantage():
    # r = 1 everywhere: L = −A, nothing clipped.
    loss, stats = loss_of([-1.0, -2.0, -0.5], [-1.0, -2.0, -0.5], [1.0, -2.0, 4.0])
    assert close(loss, -(1.0 - 2.0 + 4.0) / 3)
    assert close(stats["importance_ratio"], 1.0) and close(stats["approx_kl"], 0.0)
    assert close(stats["clip_fraction"], 0.0)


def test_ratio_is_clipped_only_on_the_side_that_would_increase_the_objective():
    # ε = 0.2. Per token (r, A) → L = max(−A·r, −A·clip(r, 0.8, 1.2)):
    #   (1.5, +1) → max(−1.5, −1.2) = −1.2  clipped
    #   (1.5, −1) → max( 1.5,  1.2) =  1.5  not clipped
    #   (0.5, +1) → max(−0.5, −0.8) = −0.5  not clipped
    #   (0.5, −1) → max( 0.5,  0.8) =  0.8  clipped
    lr = [math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5)]
    loss, stats = loss_of(lr, [0.0] * 4, [1.0, -1.0, 1.0, -1.0])
    assert close(loss, (-1.2 + 1.5 - 0.5 + 0.8) / 4)
    assert close(stats["clip_fraction"], 0.5)


def test_eps_clip_high_widens_only_the_upper_bound():
    # ε = 0.2, ε_high = 0.28:
    #   (r = 1.5, A = +1) → −min(1.5, 1.28) = −1.28   (symmetric clipping would give −1.2)
    #   (r = 0.5, A = −1) → max(0.5, 0.8) = 0.8       (lower bound still 1 − ε = 0.8)
    lr = [math.log(1.5), math.log(0.5)]
    loss_high, _ = loss_of(lr, [0.0, 0.0], [1.0, -1.0], eps_clip_high=0.28)
    loss_sym, _ = loss_of(lr, [0.0, 0.0], [1.0, -1.0])
    assert close(loss_high, (-1.28 + 0.8) / 2)
    assert close(loss_sym, (-1.2 + 0.8) / 2)


def test_dual_clip_bounds_the_loss_of_negative_advantages_by_c_times_abs_advantage():
    # ε = 0.2, c = 3, r = 5:
    #   A = −1: PPO loss max(5, 1.2) = 5, dual clip min(5, 3·1) = 3
    #   A = +1: max(−5, −1.2) = −1.2, dual clip does not apply to positive advantages
    lr = [math.log(5.0), math.log(5.0)]
    loss, stats = loss_of(lr, [0.0, 0.0], [-1.0, 1.0], c_clip=3.0)
    assert close(loss, (3.0 - 1.2) / 2)
    assert close(stats["dual_clip_fraction"], 0.5)
    loss_no_dual, stats_no_dual = loss_of(lr, [0.0, 0.0], [-1.0, 1.0])
    assert close(loss_no_dual, (5.0 - 1.2) / 2) and close(stats_no_dual["dual_clip_fraction"], 0.0)


@pytest.mark.parametrize("c_clip", [1.0, 0.5, -2.0])
def test_dual_clip_constant_must_exceed_one(c_clip):
    with pytest.raises(ValueError, match="c_clip"):
        loss_of([0.0], [0.0], [1.0], c_clip=c_clip)


def test_proximal_logprobs_replace_behaviour_in_the_ratio_and_weight_the_loss():
    # old = 0, prox = log 1.25 (w = 1.25), logp = prox (r = 1), A = 2: L = −2·1·1.25 = −2.5.
    prox = [math.log(1.25)]
    loss, stats = loss_of(prox, [0.0], [2.0], proximal_logprobs=prox, behav_imp_weight_cap=2.0)
    assert close(loss, -2.5)
    assert close(stats["importance_ratio"], 1.0)
    assert close(stats["behav_imp_weight"], 1.25)
    assert close(stats["behav_kl"], -math.log(1.25))  # mean of old − prox


def test_behaviour_weight_above_the_cap_zeroes_the_token_but_keeps_it_in_the_denominator():
    # Token 0: w = exp(log 2 − 0) = 2 > cap 1.5 → weight 0 → contributes 0.
    # Token 1: w = 1, r = 1, A = 1 → L = −1.
    # loss = (0 + (−1)) / 2 tokens = −0.5
    prox = [math.log(2.0), 0.0]
    loss, stats = loss_of(prox, [0.0, 0.0], [1.0, 1.0], proximal_logprobs=prox, behav_imp_weight_cap=1.5)
    assert close(loss, -0.5)
    assert close(stats["behav_capped_fraction"], 0.5)
    assert close(stats["behav_imp_weight"], 1.0)  # mean over the tokens that were kept


def test_empty_mask_gives_zero_loss_and_zero_stats_not_nan():
    logp = torch.zeros(4, requires_grad=True)
    loss, stats = actor_loss_fn(logp, torch.zeros(4), torch.ones(4), 0.2, torch.zeros(4, dtype=torch.bool))
    assert loss.item() == 0.0
    assert all(torch.isfinite(v).all() for v in stats.values())
    assert stats["n_tokens"].item() == 0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(4))


def test_masked_out_tokens_do_not_affect_loss():
    loss_a, _ = loss_of([0.1, 5.0], [0.0, 0.0], [1.0, 100.0], mask=[True, False])
    loss_b, _ = loss_of([0.1], [0.0], [1.0])
    assert close(loss_a, loss_b)


def test_sum_reduction_with_the_token_count_recovers_the_mean():
    # A caller forms a global token mean: Σ over ranks of sums / Σ over ranks of n_tokens.
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(2, 6, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(2, 6, generator=g) > 0.3
    mean_loss, _ = actor_loss_fn(logp, old, adv, 0.2, mask)
    sum0, stats0 = actor_loss_fn(logp[0], old[0], adv[0], 0.2, mask[0], reduce="sum")
    sum1, stats1 = actor_loss_fn(logp[1], old[1], adv[1], 0.2, mask[1], reduce="sum")
    assert close((sum0 + sum1) / (stats0["n_tokens"] + stats1["n_tokens"]), mean_loss, 1e-12)


def test_gradient_flows_only_through_the_current_logprobs():
    g = torch.Generator().manual_seed(2)
    logp, old, prox, adv = (torch.randn(8, generator=g).requires_grad_() for _ in range(4))
    loss, stats = actor_loss_fn(
        logp,
        old,
        adv,
        0.2,
        torch.ones(8, dtype=torch.bool),
        c_clip=3.0,
        proximal_logprobs=prox,
        behav_imp_weight_cap=5.0,
    )
    loss.backward()
    assert logp.grad is not None and logp.grad.abs().sum() > 0
    assert old.grad is None and prox.grad is None and adv.grad is None
    assert all(not v.requires_grad for v in stats.values())


def test_loss_gradient_is_zero_on_clipped_tokens():
    # A = +1 with r = 1.5 > 1 + ε: the clipped constant wins, so the token gives no gradient.
    logp = torch.tensor([math.log(1.5)], requires_grad=True)
    loss, _ = actor_loss_fn(logp, torch.zeros(1), torch.ones(1), 0.2, torch.ones(1, dtype=torch.bool))
    loss.backward()
    assert logp.grad.item() == 0.0


# =============================================================================================
# Actor loss: against the slow reference on random inputs
# =============================================================================================

token = st.tuples(
    st.floats(-3, 0),  # logp
    st.floats(-3, 0),  # old
    st.floats(-3, 0),  # prox
    st.floats(-2, 2),  # advantage
    st.booleans(),  # mask
)


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(token, min_size=0, max_size=12),
    eps=st.floats(0.05, 0.4),
    eps_high=st.one_of(st.none(), st.floats(0.05, 0.5)),
    c_clip=st.one_of(st.none(), st.floats(1.5, 5.0)),
    use_prox=st.booleans(),
    cap=st.one_of(st.none(), st.floats(1.0, 4.0)),
)
def test_actor_loss_matches_per_token_reference(tokens, eps, eps_high, c_clip, use_prox, cap):
    logp, old, prox, adv, mask = (list(col) for col in zip(*tokens)) if tokens else ([], [], [], [], [])
    prox = prox if use_prox else None
    loss, _ = actor_loss_fn(
        T(logp, dtype=torch.float64),
        T(old, dtype=torch.float64),
        T(adv, dtype=torch.float64),
        eps,
        T(mask, dtype=torch.bool),
        c_clip=c_clip,
        proximal_logprobs=None if prox is None else T(prox, dtype=torch.float64),
        behav_imp_weight_cap=cap,
        eps_clip_high=eps_high,
    )
    expected = reference_actor_loss(logp, old, adv, mask, eps, eps if eps_high is None else eps_high, c_clip, prox, cap)
    assert close(loss, expected, 1e-9)


def test_actor_loss_accepts_bfloat16_inputs_and_computes_in_float32():
    logp = torch.tensor([-1.0, -0.5], dtype=torch.bfloat16)
    loss, _ = actor_loss_fn(
        logp, logp.clone(), torch.tensor([1.0, 3.0], dtype=torch.bfloat16), 0.2, torch.ones(2, dtype=torch.bool)
    )
    assert loss.dtype == torch.float32 and close(loss, -2.0)


# =============================================================================================
# Normalisation and GRPO advantages
# =============================================================================================


def test_masked_normalization_uses_population_variance_over_the_mask():
    # Masked values [1, 2, 3, 6]: mean 3, population variance (4 + 1 + 0 + 9)/4 = 3.5.
    x = T([1.0, 2.0, 100.0, 3.0, 6.0])
    mask = T([True, True, False, True, True])
    out = masked_normalization(x, mask, eps=0.0)
    s = math.sqrt(3.5)
    assert close(out, [-2 / s, -1 / s, 0.0, 0.0, 3 / s], 1e-6)


def test_masked_normalization_without_mask_gives_zero_mean_unit_variance():
    x = torch.randn(64, generator=torch.Generator().manual_seed(3)) * 7 + 100
    out = masked_normalization(x, eps=0.0)
    assert abs(out.mean().item()) < 1e-5 and abs(out.var(unbiased=False).item() - 1) < 1e-5
    assert out.dtype == x.dtype


def test_masked_normalization_of_an_empty_mask_is_zero():
    x = T([1.0, 2.0])
    out = masked_normalization(x, T([False, False]))
    assert torch.equal(out, torch.zeros(2))


def test_masked_normalization_all_reduce_without_process_group_is_local():
    x = T([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(masked_normalization(x, all_reduce=True), masked_normalization(x))


def _normalise_on_rank(rank, world_size, init_file, shards, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        x, mask = shards[rank]
        torch.save(masked_normalization(x, mask, eps=0.0, all_reduce=True), f"{out_file}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.system
def test_masked_normalization_all_reduce_uses_global_statistics_across_ranks(tmp_path):
    # Two gloo ranks each hold half the data; the result must equal normalising the whole batch.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 10, generator=g, dtype=torch.float64) * 3 + 1
    mask = torch.rand(2, 10, generator=g) > 0.4
    x[1] += 5.0  # rank 1's data has a different mean, so local statistics would differ
    shards = [(x[0], mask[0]), (x[1], mask[1])]
    torch.multiprocessing.spawn(
        _normalise_on_rank, args=(2, str(tmp_path / "init"), shards, str(tmp_path / "out")), nprocs=2
    )
    got = torch.stack([torch.load(tmp_path / f"out.{r}") for r in range(2)])
    assert close(got, masked_normalization(x, mask, eps=0.0), 1e-12)


def test_grpo_advantages_normalise_within_each_group_by_population_std():
    # Group 7 (interleaved): rewards [1, 0, 0, 1], mean 0.5, population std 0.5 → ±0.5/(0.5 + 1e-6).
    # Group 3: a single sample → 0.
    rewards = T([1.0, 5.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    groups = T([7, 3, 7, 7, 7])
    adv = grpo_advantages(rewards, groups)
    k = 0.5 / (0.5 + 1e-6)
    assert close(adv, [k, 0.0, -k, -k, k], 1e-9)


def test_dr_grpo_subtracts_only_the_group_mean():
    adv = grpo_advantages(T([1.0, 5.0, 0.0, 0.0, 1.0]), T([7, 3, 7, 7, 7]), norm_std=False)
    assert close(adv, [0.5, 0.0, -0.5, -0.5, 0.5])


def test_grpo_advantages_match_per_group_python_reference():
    rng = random.Random(4)
    for _ in range(20):
        n = rng.randint(1, 30)
        groups = [rng.randint(0, 4) for _ in range(n)]
        rewards = [rng.choice([0.0, 1.0, rng.uniform(-2, 2)]) for _ in range(n)]
        expected = []
        for g, r in zip(groups, rewards):
            members = [rr for gg, rr in zip(groups, rewards) if gg == g]
            mean = sum(members) / len(members)
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / len(members))
            expected.append((r - mean) / (std + 1e-6))
        assert close(grpo_advantages(T(rewards, dtype=torch.float64), T(groups)), expected, 1e-9)


# =============================================================================================
# KL terms and reward shaping
# =============================================================================================


def test_kl_estimators_match_their_formulas():
    # log_ratio = logp − ref = 0.5:
    #   k1 = 0.5;  k2 = ½·0.25 = 0.125;  k3 = e^{−0.5} − 1 + 0.5 = 0.6065307 − 0.5 = 0.1065307
    logp, ref = T([-1.0]), T([-1.5])
    assert close(kl_estimate(logp, ref, "k1"), [0.5])
    assert close(kl_estimate(logp, ref, "k2"), [0.125])
    assert close(kl_estimate(logp, ref, "k3"), [math.exp(-0.5) - 0.5], 1e-6)


def test_k2_and_k3_are_never_negative_and_all_vanish_on_equal_policies():
    x = torch.linspace(-5, 5, 101)
    assert (kl_estimate(x, torch.zeros_like(x), "k2") >= 0).all()
    assert (kl_estimate(x, torch.zeros_like(x), "k3") >= 0).all()
    for kind in ("k1", "k2", "k3"):
        assert torch.equal(kl_estimate(x, x, kind), torch.zeros_like(x))


def test_unknown_kl_kind_is_rejected():
    with pytest.raises(ValueError, match="k1"):
        kl_estimate(T([0.0]), T([0.0]), "k4")


def test_rewards_with_kl_adds_score_at_last_masked_token_and_penalty_on_every_masked_token():
    # kl_ctl = 0.1; rows of 2 and 3 masked tokens with scores 1 and −1; 0 off the mask.
    kl = T([[1.0, 2.0, 9.0], [0.0, 0.5, 1.0]])
    mask = T([[True, True, False], [True, True, True]])
    out = rewards_with_kl(T([1.0, -1.0]), kl, 0.1, mask=mask)
    assert close(out, [[-0.1, 0.8, 0.0], [0.0, -0.05, -1.1]])


def test_rewards_with_kl_needs_a_masked_token_per_sequence():
    with pytest.raises(ValueError, match="no masked tokens"):
        rewards_with_kl(T([1.0, 2.0]), T([[0.0], [0.0]]), 0.1, mask=T([[True], [False]]))


def test_shape_reward_adds_bias_then_scales_then_clips():
    # (r + bias)·scaling with bias −0.5, scaling 2: [−2, 0, 3] → [−5, −1, 5]; clip 4 → [−4, −1, 4].
    r = T([-2.0, 0.0, 3.0])
    assert close(shape_reward(r, scaling=2.0, bias=-0.5), [-5.0, -1.0, 5.0])
    assert close(shape_reward(r, scaling=2.0, bias=-0.5, clip=4.0), [-4.0, -1.0, 4.0])
    assert torch.equal(shape_reward(r), r)
