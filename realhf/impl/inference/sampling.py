"""Batched next-token sampling for every running request at once.

One call handles the [n, vocab] logits of all running requests with per-row temperature, top-p
and top-k: a handful of tensor ops per decode step, never a Python loop over requests.

Log-probs follow SGLang: the log-prob of the sampled token under `log_softmax(logits / T)`,
*before* top-p / top-k filtering (the filters only shape the sampling distribution). Greedy rows
(T = 0) report `log_softmax(logits)` — temperature treated as 1 for the log-prob — and take the
argmax.

Sampling uses the exponential race (Gumbel-max): `argmax(log p − log E)` with `E ~ Exp(1)`
draws a token with probability p, with one vectorised argmax instead of a multinomial per row.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

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

    logits: [n, V] float32. temperature: [n], 0 = greedy. top_p: [n], values >= 1 mean off.
    top_k: [n] int64, values >= V mean off. The three flags are what the caller knows about the
    rows (kept as Python counters so that no step pays for a reduction to find out):
    `all_greedy` / `any_greedy` — some rows have T = 0; `any_filter` — some row uses top-p/top-k.
    """
    if all_greedy:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logp.argmax(dim=-1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)

    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature) if any_greedy else temperature
    logp = torch.log_softmax(logits / t[:, None], dim=-1)
    # log E with E = −log U ~ Exp(1), U ~ Uniform[0, 1): uniform_ is ~6x cheaper than
    # exponential_ on CPU. U = 0 gives E = inf, a score of −inf: never chosen, never NaN.
    noise = torch.empty_like(logp).uniform_(generator=generator).log_().neg_().log_()

    if any_filter:
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        vocab = logp.shape[-1]
        remove = torch.arange(vocab)[None, :] >= top_k[:, None]
        probs = sorted_logp.exp()
        # SGLang's rule: drop a token once the mass strictly before it already exceeds top_p
        # (the most likely token always stays). Rows with top_p >= 1 skip the rule, so float
        # rounding of the cumulative sum can never drop a tail token there.
        before = probs.cumsum(dim=-1) - probs
        remove |= (before > top_p[:, None]) & (top_p[:, None] < 1.0)
        choice = (sorted_logp.masked_fill(remove, float("-inf")) - noise).argmax(dim=-1)
        tokens = order.gather(1, choice[:, None]).squeeze(1)
    else:
        tokens = (logp - noise).argmax(dim=-1)

    if any_greedy:
        tokens = torch.where(greedy, logp.argmax(dim=-1), tokens)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
