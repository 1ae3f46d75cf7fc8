"""The decoding state of the running requests, one tensor row per slot, and one sampling step over it.

Running requests occupy slots 0..n-1 (the engine compacts them when requests leave), and every
per-request value the decode step needs — lengths, limits, sampling settings, stop tokens, the
tokens and log-probs generated so far — lives in a tensor indexed by slot. So a step is a fixed
number of tensor ops whatever n is:

    sample one token per row from its logits     (min_new_tokens masks the stop tokens first)
    append it and its log-prob to the row
    report the rows that hit a stop token or their length limit

The engine (`realhf.impl.inference.engine`) decides which requests occupy which rows; this module
knows nothing about requests' futures, threads or the model.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import torch

from realhf.impl.inference.request import SamplingParams
from realhf.impl.inference.sampling import sample


class SlotState:
    """Per-slot decoding state of up to `n_slots` running requests, rows 0..n-1 in use."""

    def __init__(self, n_slots: int, context_len: int, vocab_size: int):
        S, C = n_slots, context_len
        self.n_slots, self.context_len, self.vocab_size = S, C, vocab_size
        self.seq_len = torch.zeros(S, dtype=torch.long)  # prompt + generated (last token not yet cached)
        self.last_tok = torch.zeros(S, dtype=torch.long)
        self.n_gen = torch.zeros(S, dtype=torch.long)
        self.max_new = torch.zeros(S, dtype=torch.long)
        self.min_new = torch.zeros(S, dtype=torch.long)
        self.temp = torch.ones(S, dtype=torch.float32)
        self.top_p = torch.ones(S, dtype=torch.float32)
        self.top_k = torch.full((S,), vocab_size, dtype=torch.long)
        self.stop_ids = torch.full((S, 1), -1, dtype=torch.long)  # padded with -1; widened on demand
        self.out_tok = torch.zeros(S, C, dtype=torch.long)
        self.out_lp = torch.zeros(S, C, dtype=torch.float32)
        # Python counters of the rows in use, so a step never reduces a tensor to learn them.
        self._n_rows = 0
        self._n_greedy = 0
        self._n_filter = 0
        self._n_min_new = 0

    def fill(self, lo: int, sampling: Sequence[SamplingParams], prompt_lens: torch.Tensor,
             stop_ids: Sequence[List[int]]) -> None:
        """Rows lo..lo+b-1 start new requests: prompts of `prompt_lens` tokens, nothing generated."""
        hi = lo + len(sampling)
        self.temp[lo:hi] = torch.tensor([s.temperature for s in sampling], dtype=torch.float32)
        self.top_p[lo:hi] = torch.tensor([s.top_p for s in sampling], dtype=torch.float32)
        self.top_k[lo:hi] = torch.tensor([s.top_k if s.top_k > 0 else self.vocab_size for s in sampling])
        # Capped by the room left in the context, so one comparison per step covers both limits.
        self.max_new[lo:hi] = torch.tensor([min(s.max_new_tokens, self.context_len - int(n))
                                            for s, n in zip(sampling, prompt_lens)])
        self.min_new[lo:hi] = torch.tensor([s.min_new_tokens for s in sampling])
        width_stop = max(1, max(len(ids) for ids in stop_ids))
        if width_stop > self.stop_ids.shape[1]:
            wider = torch.full((self.n_slots, width_stop), -1, dtype=torch.long)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[lo:hi] = -1
        for i, ids in enumerate(stop_ids):
            if ids:
                self.stop_ids[lo + i, : len(ids)] = torch.tensor(ids)
        self.n_gen[lo:hi] = 0
        self.seq_len[lo:hi] = prompt_lens
        for s in sampling:
            self._count(s, +1)

    def sample_append(self, logits: torch.Tensor, lo: int, hi: int,
                      generator: torch.Generator) -> Tuple[List[int], List[Dict[str, Any]]]:
        """Sample one token for rows lo..hi-1 from their logits [hi-lo, vocab] and append it.
        Returns the rows that finished and their SGLang `finish_reason`s."""
        n_gen = self.n_gen[lo:hi]  # [b], a view: updated in place below
        stop_ids = self.stop_ids[lo:hi]  # [b, width_stop]
        if self._n_min_new:
            # Rows below min_new_tokens must not stop: their stop tokens get probability 0 (as
            # SGLang's min-new-tokens penalizer; the log-probs are those of the masked logits).
            below = n_gen < self.min_new[lo:hi]  # [b]
            if bool(below.any()):
                rows, cols = ((stop_ids >= 0) & below[:, None]).nonzero(as_tuple=True)
                logits = logits.clone()
                logits[rows, stop_ids[rows, cols]] = float("-inf")
        tokens, logprobs = sample(  # [b], [b]
            logits, self.temp[lo:hi], self.top_p[lo:hi], self.top_k[lo:hi],
            all_greedy=self._n_greedy == self._n_rows, any_greedy=self._n_greedy > 0,
            any_filter=self._n_filter > 0, generator=generator,
        )
        rows = torch.arange(lo, hi)
        self.out_tok[rows, n_gen] = tokens
        self.out_lp[rows, n_gen] = logprobs
        n_gen += 1
        self.seq_len[lo:hi] += 1
        self.last_tok[lo:hi] = tokens

        hit_stop = (stop_ids == tokens[:, None]).any(dim=1)  # [b]
        done = hit_stop | (n_gen >= self.max_new[lo:hi])  # max_new is capped by the context left
        if not bool(done.any()):
            return [], []
        idx = done.nonzero().flatten().tolist()
        stops = hit_stop[idx].tolist()
        toks = tokens[idx].tolist()
        reasons = []
        for i, stopped, tok in zip(idx, stops, toks):
            if stopped:
                reasons.append({"type": "stop", "matched": tok})
            else:
                reasons.append({"type": "length", "length": int(self.n_gen[lo + i])})
        return [lo + i for i in idx], reasons

    def release(self, slot: int, sampling: SamplingParams) -> Tuple[List[int], List[float]]:
        """The tokens and log-probs a leaving row generated; its settings stop counting."""
        g = int(self.n_gen[slot])
        self._count(sampling, -1)
        return self.out_tok[slot, :g].tolist(), self.out_lp[slot, :g].tolist()

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows `src` into rows `dst` (compaction after requests left)."""
        for t in (self.seq_len, self.last_tok, self.n_gen, self.max_new, self.min_new, self.temp,
                  self.top_p, self.top_k, self.stop_ids):
            t[dst] = t[src]
        g = int(self.n_gen[dst].max())
        self.out_tok[dst, :g] = self.out_tok[src, :g]
        self.out_lp[dst, :g] = self.out_lp[src, :g]

    def _count(self, s: SamplingParams, sign: int) -> None:
        self._n_rows += sign
        self._n_greedy += sign * (s.temperature <= 0)
        self._n_filter += sign * (s.top_k > 0 or s.top_p < 1)
        self._n_min_new += sign * (s.min_new_tokens > 0)
