"""Batched next-token sampling for every running request at once.

One call handles the [n, vocab] logits of all running requests with per-row temperature, top-p
and top-k: a handful of tensor ops per decode step, never a Python loop over requests.

Log-probs follow SGLang: the log-prob of the sampled token under `log_softmax(logits / T)`,
*before* top-p / top-k filtering (the filters only shape the sampling distribution). Greedy rows
(T = 0) report `log_softmax(logits)` — temperature treated as 1 for the log-prob — and take the
argmax.

Sampling is by inverse CDF with one uniform number per row: with `e = exp(logits / T − max)`
(unnormalised probabilities) and `u` uniform in (0, Σe], the token is the first index whose
cumulative sum reaches `u` — token j is drawn with probability e_j / Σe, and a token of
probability 0 (logit −inf) can never be drawn. The `e` it needs are the ones the log-prob needs
anyway (`logsumexp = max + log Σe`), so a step pays one exp and one cumulative sum over
[n, vocab] and n random numbers. (The exponential race `argmax(log p − log E)` it replaced needed
[n, vocab] random numbers and two more logs of them: ≈3× the time at 256 rows.)
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch


def _inverse_cdf(weights: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Row-wise draws [n] from non-negative, unnormalised weights [n, V]."""
    cdf = weights.cumsum(dim=-1)
    # 1 − U with U uniform in [0, 1) lies in (0, 1], so u is in (0, cdf[-1]]: the search always
    # lands inside the row, and never on a zero-weight token (whose cdf equals its predecessor's).
    u = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device).neg_().add_(1.0).mul_(cdf[:, -1:])
    return torch.searchsorted(cdf, u).squeeze(1)


def sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    *,
    all_greedy: bool,
    any_greedy: bool,
    any_filter: bool,
    generator: Optional[torch.Generator] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tokens [n] (int64) and their log-probs [n] (float32).

    All tensors on one device (the logits'), `generator` too; the results stay there.
    logits: [n, V] float32. temperature: [n], 0 = greedy. top_p: [n], values >= 1 mean off.
    top_k: [n] int64, values >= V mean off. The three flags are what the caller knows about the
    rows (kept as Python counters so that no step pays for a reduction to find out):
    `all_greedy` / `any_greedy` — some rows have T = 0; `any_filter` — some row uses top-p/top-k.
    """
    if all_greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)

    greedy = temperature <= 0 if any_greedy else None
    t = torch.where(greedy, torch.ones_like(temperature), temperature) if any_greedy else temperature
    scaled = logits / t[:, None]
    peak = scaled.amax(dim=-1, keepdim=True)
    weights = (scaled - peak).exp_()  # unnormalised probabilities, the largest = 1
    total = weights.sum(dim=-1, keepdim=True)

    if any_filter:
        sorted_w, order = weights.sort(dim=-1, descending=True)
        vocab = weights.shape[-1]
        remove = torch.arange(vocab, device=weights.device)[None, :] >= top_k[:, None]  # [n, V]
        # SGLang's rule: drop a token once the mass strictly before it already exceeds top_p
        # (the most likely token always stays). Rows with top_p >= 1 skip the rule, so float
        # rounding of the cumulative sum can never drop a tail token there.
        probs = sorted_w / total
        before = probs.cumsum(dim=-1) - probs
        remove |= (before > top_p[:, None]) & (top_p[:, None] < 1.0)
        choice = _inverse_cdf(sorted_w.masked_fill_(remove, 0.0), generator)
        tokens = order.gather(1, choice[:, None]).squeeze(1)
    else:
        tokens = _inverse_cdf(weights, generator)

    if any_greedy:
        tokens = torch.where(greedy, scaled.argmax(dim=-1), tokens)  # greedy rows: T = 1, scaled = logits
    # log_softmax at the chosen token: scaled − (max + log Σ exp(scaled − max)).
    logprobs = scaled.gather(1, tokens[:, None]) - peak - total.log()
    return tokens, logprobs.squeeze(1)
