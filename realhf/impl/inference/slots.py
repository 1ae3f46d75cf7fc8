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

Every tensor lives on the engine's device, so a step never crosses to the host for its math; what
the host needs (which rows finished and why, the finished rows' tokens and log-probs) crosses in
a few batched transfers on the steps where rows finish, never per token.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from realhf.impl.inference.request import SamplingParams
from realhf.impl.inference.sampling import sample

# Where results go on their way to Python lists and JSON: host memory whatever the engine's device
# (not a choice of device: `realhf.base.device` makes that one).
_HOST = torch.device("cpu")


class SlotState:
    """Per-slot decoding state of up to `n_slots` running requests, rows 0..n-1 in use, on `device`."""

    def __init__(self, n_slots: int, context_len: int, vocab_size: int, device: Optional[torch.device] = None):
        S, C = n_slots, context_len
        self.n_slots, self.context_len, self.vocab_size = S, C, vocab_size
        self.device = dev = device or _HOST
        self.seq_len = torch.zeros(S, dtype=torch.long, device=dev)  # prompt + generated (last token not yet cached)
        self.last_tok = torch.zeros(S, dtype=torch.long, device=dev)
        self.n_gen = torch.zeros(S, dtype=torch.long, device=dev)
        self.max_new = torch.zeros(S, dtype=torch.long, device=dev)
        self.min_new = torch.zeros(S, dtype=torch.long, device=dev)
        self.temp = torch.ones(S, dtype=torch.float32, device=dev)
        self.top_p = torch.ones(S, dtype=torch.float32, device=dev)
        self.top_k = torch.full((S,), vocab_size, dtype=torch.long, device=dev)
        self.stop_ids = torch.full((S, 1), -1, dtype=torch.long, device=dev)  # padded with -1; widened on demand
        self.out_tok = torch.zeros(S, C, dtype=torch.long, device=dev)
        self.out_lp = torch.zeros(S, C, dtype=torch.float32, device=dev)
        # Python counters of the rows in use, so a step never reduces a tensor to learn them.
        self._n_rows = 0
        self._n_greedy = 0
        self._n_filter = 0
        self._n_min_new = 0

    def fill(
        self, lo: int, sampling: Sequence[SamplingParams], prompt_lens: Sequence[int], stop_ids: Sequence[List[int]]
    ) -> None:
        """Rows lo..lo+b-1 start new requests: prompts of `prompt_lens` tokens, nothing generated."""
        hi, dev = lo + len(sampling), self.device
        self.temp[lo:hi] = torch.tensor([s.temperature for s in sampling], dtype=torch.float32, device=dev)
        self.top_p[lo:hi] = torch.tensor([s.top_p for s in sampling], dtype=torch.float32, device=dev)
        self.top_k[lo:hi] = torch.tensor(
            [min(s.top_k, self.vocab_size) if s.top_k > 0 else self.vocab_size for s in sampling], device=dev
        )
        # Capped by the room left in the context, so one comparison per step covers both limits.
        self.max_new[lo:hi] = torch.tensor(
            [min(s.max_new_tokens, self.context_len - n) for s, n in zip(sampling, prompt_lens)], device=dev
        )
        self.min_new[lo:hi] = torch.tensor([s.min_new_tokens for s in sampling], device=dev)
        width_stop = max(1, max(len(ids) for ids in stop_ids))
        if width_stop > self.stop_ids.shape[1]:
            wider = torch.full((self.n_slots, width_stop), -1, dtype=torch.long, device=dev)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        width_stop = self.stop_ids.shape[1]
        self.stop_ids[lo:hi] = torch.tensor(
            [ids + [-1] * (width_stop - len(ids)) for ids in stop_ids], dtype=torch.long, device=dev
        )  # [b, width_stop]
        self.n_gen[lo:hi] = 0
        self.seq_len[lo:hi] = torch.tensor(prompt_lens, dtype=torch.long, device=dev)
        for s in sampling:
            self._count(s, +1)

    def sample_append(
        self, logits: torch.Tensor, lo: int, hi: int, generator: torch.Generator
    ) -> Tuple[List[int], List[Dict[str, Any]]]:
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
            logits,
            self.temp[lo:hi],
            self.top_p[lo:hi],
            self.top_k[lo:hi],
            all_greedy=self._n_greedy == self._n_rows,
            any_greedy=self._n_greedy > 0,
            any_filter=self._n_filter > 0,
            generator=generator,
        )
        rows = torch.arange(lo, hi, device=self.device)
        self.out_tok[rows, n_gen] = tokens
        self.out_lp[rows, n_gen] = logprobs
        n_gen += 1
        self.seq_len[lo:hi] += 1
        self.last_tok[lo:hi] = tokens

        hit_stop = (stop_ids == tokens[:, None]).any(dim=1)  # [b]
        done = hit_stop | (n_gen >= self.max_new[lo:hi])  # max_new is capped by the context left
        if not bool(done.any()):  # the step's one wait for the device
            return [], []
        idx = done.nonzero().flatten()  # [k]
        # Everything the reasons need, in one transfer: rows, stopped?, token, tokens generated.
        finished = torch.stack([idx, hit_stop[idx].long(), tokens[idx], n_gen[idx]]).tolist()  # [4, k]
        reasons = [
            {"type": "stop", "matched": tok} if stopped else {"type": "length", "length": g}
            for stopped, tok, g in zip(*finished[1:])
        ]
        return [lo + i for i in finished[0]], reasons

    def release(self, slots: Sequence[int], sampling: Sequence[SamplingParams]) -> List[Tuple[List[int], List[float]]]:
        """The tokens and log-probs the leaving rows generated, in one transfer to the host for all
        of them; their settings stop counting."""
        if not slots:
            return []
        rows = torch.tensor(slots, dtype=torch.long, device=self.device)  # [k]
        n_gen = self.n_gen[rows].tolist()
        g = max(n_gen)
        # A gather on the device, then one copy each to the host (a no-op on the CPU); the lists
        # are built from the host copies, row by row, without the padding after each answer.
        toks = self.out_tok[rows, :g].to(_HOST)  # [k, g]
        lps = self.out_lp[rows, :g].to(_HOST)  # [k, g]
        for s in sampling:
            self._count(s, -1)
        return [(toks[i, :n].tolist(), lps[i, :n].tolist()) for i, n in enumerate(n_gen)]

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy rows `src` into rows `dst` (compaction after requests left)."""
        for t in (
            self.seq_len,
            self.last_tok,
            self.n_gen,
            self.max_new,
            self.min_new,
            self.temp,
            self.top_p,
            self.top_k,
            self.stop_ids,
        ):
            t[dst] = t[src]
        g = int(self.n_gen[dst].max())
        self.out_tok[dst, :g] = self.out_tok[src, :g]
        self.out_lp[dst, :g] = self.out_lp[src, :g]

    def _count(self, s: SamplingParams, sign: int) -> None:
        self._n_rows += sign
        self._n_greedy += sign * (s.temperature <= 0)
        self._n_filter += sign * (s.top_k > 0 or s.top_p < 1)
        self._n_min_new += sign * (s.min_new_tokens > 0)
