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
`values` by the actor / reference / critic inference nodes of the step's graph
(realhf.system.trainer.ppo_step), `prox_computed` [N] the rows the actor's inference computed
(the rest are left to the first minibatch's train forward), `advantages` and `returns` by the
advantages node; `extra` holds the tensors a graph's own nodes write, by name (`get`/`set`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

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
    prox_computed: Optional[torch.Tensor] = None
    extra: Dict[str, torch.Tensor] = field(default_factory=dict)

    def get(self, name: str) -> Optional[torch.Tensor]:
        """The step's tensor `name`: a field above, or one a graph's own node wrote (`extra`)."""
        if name != "extra" and name in _FIELDS:
            return getattr(self, name)
        return self.extra.get(name)

    def set(self, name: str, value: torch.Tensor) -> None:
        if name != "extra" and name in _FIELDS:
            setattr(self, name, value)
        else:
            self.extra[name] = value

    @property
    def n_seqs(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_tokens(self) -> int:
        """Trained (loss-masked) tokens."""
        return int(self.loss_mask.sum())

    def to(self, device) -> "TrainBatch":
        """Every tensor on `device`."""
        out: Dict[str, Any] = {n: getattr(self, n) for n in _FIELDS if n != "extra"}
        out = {n: None if t is None else t.to(device) for n, t in out.items()}
        return TrainBatch(**out, extra={n: t.to(device) for n, t in self.extra.items()})

    def select(self, rows: torch.Tensor) -> "TrainBatch":
        """The sub-batch of `rows`, trimmed to its longest sequence (right padding makes the
        trim exact: no real token moves)."""
        width = int(self.attention_mask[rows].sum(dim=1).max()) if len(rows) else 1
        width = max(width, 2)

        def cut(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            if t is None:
                return None
            if t.dim() == 1:
                return t[rows]
            if t.shape[1] == self.input_ids.shape[1]:
                return t[rows, :width]
            return t[rows, : width - 1]

        out: Dict[str, Any] = {name: cut(getattr(self, name)) for name in _FIELDS if name != "extra"}
        out["extra"] = {name: cut(t) for name, t in self.extra.items()}
        return TrainBatch(**out)


_FIELDS = tuple(f.name for f in dataclasses.fields(TrainBatch))
REQUIRED_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(TrainBatch)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


def batch_from_tensors(tensors: Dict[str, torch.Tensor]) -> TrainBatch:
    """A batch from named tensors (a node worker's inputs): the fields by name, the rest in `extra`."""
    fields = {n: t for n, t in tensors.items() if n in _FIELDS and n != "extra"}
    return TrainBatch(**fields, extra={n: t for n, t in tensors.items() if n not in _FIELDS})
