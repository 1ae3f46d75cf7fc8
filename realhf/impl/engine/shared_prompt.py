"""A micro-batch's forward with each prompt computed once for its whole group.

GRPO-style training samples `group_size` answers per prompt, so a train batch holds every
prompt `group_size` times, and a plain forward computes it that many times. Here the distinct
prompts of a micro-batch go through the model once (keeping their keys and values, with
gradients), then every row's answer part runs on top of its prompt's keys and values:

    prompts  [G, P]       one row per prompt group in the micro-batch, right padded
    answers  [n, S]       each row's tokens after its prompt, at positions P_r .. P_r + S - 1,
                          attending to its group's prompt keys (padding masked) and causally to
                          itself

and the logits are put back together as `[n, T, V]`, column t of row r being what the plain
forward gives there (to float rounding; tests/unit/impl/engine/test_shared_prompt.py checks the
logits and the gradients against it). Backward sums each prompt's gradient over the rows that
attend to it, as the plain forward's would.

Work saved: a prompt of P tokens shared by k rows costs P instead of k·P token-forwards. On the
embedded task (prompts ≈ 60% of a row, groups of 8) that is about half of the trainer's forward
and backward work; docs/benchmarks.md has the measurement. It needs a model that takes
a key/value cache (`cache`; `past_key_values` in older transformers) and `position_ids` (HF
causal LMs do); rows without a prompt length, or micro-batches where no two rows share a group,
take the plain forward.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


def shares_prompts(group_ids: torch.Tensor) -> bool:
    """Whether any two rows belong to the same prompt group (else nothing is saved)."""
    return len(group_ids) > 1 and len(torch.unique(group_ids)) < len(group_ids)


def shared_prompt_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    group_ids: torch.Tensor,
    prompt_lens: torch.Tensor,
) -> torch.Tensor:
    """`[n, T, V]` logits of right-padded rows `input_ids` `[n, T]` whose first `prompt_lens[r]`
    tokens are their group's prompt (rows of one group must have the same prompt)."""
    dev = input_ids.device
    n, width = input_ids.shape
    _, group_of_row = torch.unique(group_ids, return_inverse=True)  # [n] index into the prompts
    n_groups = int(group_of_row.max()) + 1
    # One row of each group (any would do: they share the prompt).
    first = torch.zeros(n_groups, dtype=torch.long, device=dev).scatter_(0, group_of_row, torch.arange(n, device=dev))
    plen = prompt_lens.to(dev)
    p = plen[first]  # [G]
    p_max = int(p.max())
    in_prompt = torch.arange(p_max, device=dev)[None] < p[:, None]  # [G, P]
    prompt_out = model(input_ids=input_ids[first, :p_max] * in_prompt, attention_mask=in_prompt.long(), use_cache=True)
    # transformers renamed the keys and values `past_key_values` -> `cache` (5.24 warns, the old
    # name goes in 5.40) in the forward's arguments and its output; requirements allow versions
    # from before the rename, so use the name the model's own output has.
    cache_name = "cache" if "cache" in prompt_out else "past_key_values"
    cache = DynamicCache()
    for i, layer in enumerate(prompt_out[cache_name].layers):
        cache.update(layer.keys[group_of_row], layer.values[group_of_row], i)  # [n, H, P, D] each

    lengths = attention_mask.sum(dim=1)  # [n]
    s_max = max(int((lengths - plen).max()), 1)
    columns = plen[:, None] + torch.arange(s_max, device=dev)[None]  # [n, S] where each answer token sits
    real = columns < lengths[:, None]  # [n, S]
    answer_ids = torch.gather(input_ids, 1, columns.clamp(max=width - 1)) * real
    answer_out = model(
        input_ids=answer_ids,
        attention_mask=torch.cat([in_prompt[group_of_row], real], 1).long(),
        position_ids=columns,
        use_cache=False,
        **{cache_name: cache},
    )

    # Back to [n, T, V]: columns before a row's prompt length from its prompt's logits, the
    # others from its answer's.
    t = torch.arange(width, device=dev)[None]  # [1, T]
    prompt_logits = prompt_out.logits[group_of_row]  # [n, P, V]
    if width > p_max:
        prompt_logits = torch.nn.functional.pad(prompt_logits, (0, 0, 0, width - p_max))
    else:
        prompt_logits = prompt_logits[:, :width]
    at = (t - plen[:, None]).clamp(0, s_max - 1)  # [n, T]
    answer_logits = torch.gather(answer_out.logits, 1, at[..., None].expand(-1, -1, answer_out.logits.shape[-1]))
    return torch.where((t < plen[:, None])[..., None], prompt_logits, answer_logits)
