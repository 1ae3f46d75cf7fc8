"""The batch one train step works on: what the engine API (`realhf.api.engine_api`) and the
trainer's calls share. Made from trajectories by `realhf.impl.model.batching.pack_trajectories`.

Layout (right padding, one row per sample, prompt then output):

    input_ids       [N, T]    prompt_ids + output_ids, then pad
    attention_mask  [N, T]    1 on real tokens
    token tensors   [N, T-1]  aligned with the *predictions*: column t holds what is known
                              about token t+1 (the logits at position t predict token t+1), so
                              output token j of a sample with P prompt tokens sits in column P+j-1
        loss_mask       trained tokens (generated ones; not the prompt, not inserted feedback)
        behav_logprobs  the log-prob the generation server sampled the token with
        behav_versions  the weight version that sampled it (ppo.prox_logp=loglinear reads it)
    per sample [N]   rewards, group_ids (index of the prompt group in this batch), prompt_lens
                     (the group's prompt tokens, shared by its rows: realhf.impl.engine.shared_prompt)

`no_eos` stays on the trajectories (the staleness guard and `batch_summary` read the versions
there too).

Filled in by the train step's calls, `[N, T-1]` each: `prox_logprobs` / `ref_logprobs` /
`values` by the `inference` of the actor / reference / critic, `advantages` and `returns` once
before the first train call (`realhf.impl.model.ppo_actor.ensure_advantages`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class TrainBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    behav_logprobs: torch.Tensor
    rewards: torch.Tensor
    group_ids: torch.Tensor
    prox_logprobs: Optional[torch.Tensor] = None
    ref_logprobs: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None
    advantages: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None
    prompt_lens: Optional[torch.Tensor] = None
    behav_versions: Optional[torch.Tensor] = None

    @property
    def n_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        """Trained (loss-masked) tokens."""
        return int(self.loss_mask.sum())

    def select(self, rows: torch.Tensor) -> "TrainBatch":
        """The sub-batch of `rows`, trimmed to its longest sequence (right padding makes the
        trim exact: no real token moves)."""
        width = int(self.attention_mask[rows].sum(dim=1).max()) if len(rows) else 1
        width = max(width, 2)
        out = {}
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if t is None:
                out[f.name] = None
            elif t.dim() == 1:
                out[f.name] = t[rows]
            elif t.shape[1] == self.input_ids.shape[1]:
                out[f.name] = t[rows, :width]
            else:
                out[f.name] = t[rows, : width - 1]
        return TrainBatch(**out)
