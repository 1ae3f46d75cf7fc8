"""The batched sampler's draws follow the stated distributions (chi-square, fixed seeds)."""

import pytest
import torch

from realhf.impl.inference.sampling import sample

# Chi-square critical values at p = 0.001 (scipy.stats.chi2.ppf(0.999, dof)): a correct sampler
# exceeds them with probability 0.001; the seeds are fixed, so each test is deterministic.
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 7: 24.32}


def draw(logits_row, n, temperature=1.0, top_p=1.0, top_k=None, seed=0):
    V = logits_row.shape[-1]
    logits = logits_row.expand(n, V).contiguous()
    top_k = V if top_k is None else top_k
    any_filter = top_p < 1 or top_k < V
    return sample(
        logits,
        torch.full((n,), temperature),
        torch.full((n,), top_p),
        torch.full((n,), top_k),
        all_greedy=False,
        any_greedy=False,
        any_filter=any_filter,
        generator=torch.Generator().manual_seed(seed),
    )


def chi_square(tokens, probs):
    n = tokens.numel()
    observed = torch.bincount(tokens, minlength=len(probs)).double()
    expected = probs.double() * n
    keep = expected > 0
    assert observed[~keep].sum() == 0, "a token of probability 0 was drawn"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_draws_follow_softmax_of_logits_over_temperature_chi_square():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0])
    for temperature, seed in ((1.0, 1), (0.7, 2), (1.6, 3)):
        tokens, _ = draw(logits, 40000, temperature, seed=seed)
        probs = torch.softmax(logits / temperature, -1)
        assert chi_square(tokens, probs) < CHI2_999[7], (temperature, torch.bincount(tokens) / 40000, probs)


def test_a_wrong_distribution_fails_the_same_check():
    # The check has teeth: the same draws against the T=1 probabilities of other logits.
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0, -4.0])
    tokens, _ = draw(logits, 40000, 1.0, seed=1)
    assert chi_square(tokens, torch.softmax(logits / 1.1, -1)) > CHI2_999[7]


def test_tokens_of_probability_zero_are_never_drawn_even_at_the_ends_of_the_vocabulary():
    inf = float("-inf")
    logits = torch.tensor([inf, 0.0, inf, 1.0, 0.5, inf, inf, -0.5, inf])
    tokens, logprobs = draw(logits, 30000, seed=4)
    probs = torch.softmax(logits, -1)
    assert chi_square(tokens, probs) < CHI2_999[3]
    assert torch.isfinite(logprobs).all()


def test_one_dominant_token_is_always_drawn_and_tiny_temperatures_stay_finite():
    logits = torch.tensor([0.0, 60.0, 1.0, -3.0])
    tokens, logprobs = draw(logits, 2000, temperature=1e-3, seed=5)
    assert (tokens == 1).all() and torch.isfinite(logprobs).all()


@pytest.mark.parametrize("top_k,top_p,kept", [(3, 1.0, 3), (6, 0.8, 3), (6, 0.95, 5), (2, 0.95, 2)])
def test_top_k_and_top_p_draw_from_the_renormalised_kept_tokens(top_k, top_p, kept):
    # Probabilities ≈ 0.46, 0.23, 0.14, 0.09, 0.04, 0.02, ...: top_p 0.8 keeps 3 (the mass before
    # the 4th is 0.83 > 0.8), 0.95 keeps 5 (before the 5th 0.92, before the 6th 0.97) — SGLang's
    # rule: drop a token once the mass before it exceeds top_p.
    logits = torch.tensor([3.0, 2.3, 1.8, 1.4, 0.6, 0.0, -1.0, -2.0])
    tokens, logprobs = draw(logits, 40000, top_k=top_k, top_p=top_p, seed=6)
    probs = torch.softmax(logits, -1)
    filtered = torch.zeros_like(probs)
    filtered[:kept] = probs[:kept] / probs[:kept].sum()
    assert chi_square(tokens, filtered) < CHI2_999[kept - 1]
    # The reported log-prob is that of the unfiltered distribution (SGLang's definition).
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-5)


def test_logprobs_are_log_softmax_over_temperature_and_greedy_rows_use_temperature_one():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(64, 50, generator=g) * 3
    temp = torch.rand(64, generator=g) + 0.3
    temp[::4] = 0.0  # every fourth row greedy
    tokens, logprobs = sample(
        logits,
        temp,
        torch.ones(64),
        torch.full((64,), 50),
        all_greedy=False,
        any_greedy=True,
        any_filter=False,
        generator=g,
    )
    t = torch.where(temp > 0, temp, torch.ones_like(temp))
    want = torch.log_softmax(logits / t[:, None], -1).gather(1, tokens[:, None]).squeeze(1)
    assert torch.allclose(logprobs, want, atol=1e-5)
    assert torch.equal(tokens[::4], logits[::4].argmax(-1))
