"""The policy losses `ppo.policy_loss` names (realhf.impl.model.utils.ppo_functional.actor_loss_fn
with `policy_loss=`): each against a reference written as plain loops over sequences and tokens,
values and gradients. The default `ppo` loss has its own specification in test_ppo_functional.py."""

import math

import pytest
import torch

from realhf.api.algorithms import POLICY_LOSSES as MENU
from realhf.impl.model.utils.ppo_functional import actor_loss_fn, sequence_log_ratio

POLICY_LOSSES = ("ppo", "gspo", "cpgd", "gpg")  # the built-ins


def _ragged(seed: int, n: int = 5, width: int = 7):
    """Per-row advantages (GSPO's are per sequence), log-probs near each other so some ratios
    clip and some do not, a ragged mask with one empty row."""
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(n, width, generator=g, dtype=torch.float64) * 2
    old = logp.detach() + 0.3 * torch.randn(n, width, generator=g, dtype=torch.float64)
    prox = logp.detach() + 0.15 * torch.randn(n, width, generator=g, dtype=torch.float64)
    adv = torch.randn(n, 1, generator=g, dtype=torch.float64).expand(n, width).clone()
    mask = torch.rand(n, width, generator=g) < 0.7
    mask[:, 0] = True
    mask[2] = False
    return logp, old, prox, adv, mask


def _reference(kind, logp, old, prox, adv, mask, eps, eps_high, c_clip):
    """Σ over sequences of (1/|y|)·Σ_t L_t, and L per token, computed one token at a time (the
    gradient flows through `logp` element by element via autograd on Python-scalar arithmetic)."""
    den = old if prox is None else prox
    total = torch.zeros((), dtype=torch.float64)
    per_token = {}
    gspo_grad = torch.zeros_like(logp, dtype=torch.float64)
    for i in range(logp.shape[0]):
        steps = [t for t in range(logp.shape[1]) if mask[i, t]]
        if not steps:
            continue
        if kind == "gspo":
            seq_ratio = torch.exp(sum(logp[i, t] - den[i, t] for t in steps) / len(steps))
            # The decoupled GSPO gradient on token t: w_t·(dL/ds)·s/|y| — the score-function
            # term of each token (ds/dlogp_t = s/|y|) weighted by that token's behaviour weight.
            s = seq_ratio.detach().clone().requires_grad_()
            a = float(adv[i, steps[0]])
            outer = torch.maximum(-a * s, -a * s.clamp(1 - eps, 1 + eps_high))
            if c_clip is not None and a < 0:
                outer = torch.minimum(outer, torch.tensor(c_clip * abs(a), dtype=torch.float64))
            outer.backward()
            for t in steps:
                w = 1.0 if prox is None else math.exp(float(prox[i, t] - old[i, t]))
                gspo_grad[i, t] = w * float(s.grad) * float(s.detach()) / len(steps)
        row = torch.zeros((), dtype=torch.float64)
        for t in steps:
            a = float(adv[i, t])
            if kind == "ppo":
                r = torch.exp(logp[i, t] - den[i, t])
                loss = torch.maximum(-a * r, -a * r.clamp(1 - eps, 1 + eps_high))
            elif kind == "gspo":
                loss = torch.maximum(-a * seq_ratio, -a * seq_ratio.clamp(1 - eps, 1 + eps_high))
            elif kind == "cpgd":
                lr = logp[i, t] - den[i, t]
                loss = torch.maximum(-a * lr, -a * lr.clamp(math.log(1 - eps), math.log(1 + eps_high)))
            else:  # gpg: plain policy gradient, valued from the denominator
                loss = -a * (logp[i, t] - den[i, t])
            if c_clip is not None and a < 0 and kind != "gpg":
                loss = torch.minimum(loss, torch.tensor(c_clip * abs(a), dtype=torch.float64))
            if prox is not None:
                loss = loss * math.exp(float(prox[i, t] - old[i, t]))
            per_token[i, t] = float(loss.detach())
            row = row + loss
        total = total + row / len(steps)
    return total, per_token, gspo_grad


# gpg has no clip to dual-clip (validation refuses ppo.c_clip with it).
CASES = [(kind, c_clip) for kind in POLICY_LOSSES for c_clip in (None, 2.0) if not (kind == "gpg" and c_clip)]


@pytest.mark.parametrize("kind, c_clip", CASES, ids=[f"{k}-{'dual' if c else 'no-dual'}" for k, c in CASES])
@pytest.mark.parametrize("decoupled", [False, True], ids=["coupled", "decoupled"])
def test_policy_loss_matches_a_per_sequence_per_token_reference_in_value_and_gradient(kind, decoupled, c_clip):
    logp, old, prox, adv, mask = _ragged(seed=7)
    prox = prox if decoupled else None
    eps, eps_high = (0.05, 0.08) if kind == "gspo" else (0.2, 0.28)
    got_leaf, want_leaf = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    per_token, stats = actor_loss_fn(
        got_leaf,
        old,
        adv,
        eps,
        mask,
        c_clip=c_clip,
        proximal_logprobs=prox,
        eps_clip_high=eps_high,
        reduce="none",
        policy_loss=kind,
    )
    # seq-mean-token-mean, written out: the aggregation GSPO's gradient is defined under.
    got = (per_token.sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    want, want_tokens, gspo_grad = _reference(kind, want_leaf, old, prox, adv, mask, eps, eps_high, c_clip)
    got.backward()
    want.backward()
    assert float(got.detach()) == pytest.approx(float(want.detach()), abs=1e-10)
    for (i, t), value in want_tokens.items():
        assert float(per_token[i, t].detach()) == pytest.approx(value, abs=1e-10), (i, t)
    assert (per_token[~mask] == 0).all()
    if kind == "gspo":
        # Without a behaviour weight, GSPO's gradient is the plain gradient of the sequence-level
        # objective; with one, each token's term carries its own weight.
        assert torch.allclose(got_leaf.grad, gspo_grad, atol=1e-10)
        assert decoupled or torch.allclose(want_leaf.grad, gspo_grad, atol=1e-10)
        assert gspo_grad.abs().sum() > 0
    else:
        assert torch.allclose(got_leaf.grad, want_leaf.grad, atol=1e-10)
    assert int(stats["n_tokens"]) == int(mask.sum())


def test_the_cases_above_exercise_both_sides_of_every_clip():
    # The random data must make the clip active on some rows/tokens and inactive on others,
    # else the reference comparison above would not tell a clipped loss from an unclipped one.
    logp, old, prox, adv, mask = _ragged(seed=7)
    for kind, eps in (("ppo", 0.2), ("gspo", 0.05), ("cpgd", 0.2)):
        _, stats = actor_loss_fn(logp, old, adv, eps, mask, proximal_logprobs=prox, reduce="none", policy_loss=kind)
        assert 0 < float(stats["clip_fraction"]) < 1, kind


def test_gspo_ratio_is_the_sequence_mean_on_every_token_with_each_tokens_own_gradient():
    log_ratio = torch.tensor([[0.1, 0.3, 9.0], [0.2, -0.4, 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    seq = sequence_log_ratio(log_ratio, mask)
    assert torch.allclose(seq.detach(), torch.tensor([[0.2] * 3, [-0.2 / 3] * 3]))  # the padded 9.0 is ignored
    seq[0, 1].backward()
    assert log_ratio.grad.tolist() == [[0, 1, 0], [0, 0, 0]]


def test_gspo_clips_a_whole_sequence_at_once():
    # One sequence whose mean log-ratio is above log(1 + eps) with A > 0: every token is clipped
    # (zero gradient), even the token whose own ratio is below 1.
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -0.5, 0.2]])  # token ratios e^0.5, e^0.5, e^-0.2; mean log-ratio 0.267
    loss, stats = actor_loss_fn(
        logp, old, torch.ones(1, 3), 0.2, torch.ones(1, 3, dtype=torch.bool), policy_loss="gspo"
    )
    loss.backward()
    assert float(stats["clip_fraction"]) == 1.0
    assert torch.equal(logp.grad, torch.zeros(1, 3))
    # The token-level loss leaves the third token unclipped.
    logp.grad = None
    actor_loss_fn(logp, old, torch.ones(1, 3), 0.2, torch.ones(1, 3, dtype=torch.bool))[0].backward()
    assert logp.grad[0, 2] != 0


def test_gpg_is_the_plain_policy_gradient_weighted_by_the_behaviour_correction():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old, prox = torch.tensor([[-3.0, -0.1, -0.5]]), torch.tensor([[-2.0, -0.1, -1.0]])
    adv, mask = torch.tensor([[2.0, -1.0, 0.5]]), torch.ones(1, 3, dtype=torch.bool)
    loss, stats = actor_loss_fn(logp, old, adv, 0.2, mask, proximal_logprobs=prox, reduce="sum", policy_loss="gpg")
    loss.backward()
    w = torch.exp(prox - old)
    assert torch.allclose(logp.grad, -adv * w)  # ∇(−A·w·logp); far-off ratios are not clipped
    assert float(stats["clip_fraction"]) == 0.0


def test_every_policy_loss_choice_has_a_surrogate_and_an_unknown_one_is_refused():
    assert MENU.names()[:4] == list(POLICY_LOSSES) and all(MENU.get(n).surrogate for n in POLICY_LOSSES)
    with pytest.raises(ValueError, match=r"ppo.policy_loss='trpo': choose one of \['ppo', 'gspo', 'cpgd', 'gpg'"):
        actor_loss_fn(
            torch.zeros(2), torch.zeros(2), torch.ones(2), 0.2, torch.ones(2, dtype=torch.bool), policy_loss="trpo"
        )
