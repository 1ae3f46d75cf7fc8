"""Trainer memory per device at each data- × tensor-parallel layout, computed from parameter and
optimizer sizes (docs/scaling.md prints the table this writes).

    python -m scripts.memory_per_device [--markdown]

For each model (a Qwen2.5 7B and 32B laid out from their published config values, built on the
meta device: no download, no memory) and each layout d×m it counts what one trainer rank holds:
the actor's weights, gradients and AdamW's two fp32 moments, and the frozen reference's weights
(all fp32, the defaults of actor.dtype and ref.dtype),
as realhf's FSDPEngine keeps them — the decoder layers' projections split over m
(realhf/impl/engine/tensor_parallel.py) and everything sharded over d by FSDP2; embeddings, norms
and the LM head whole on each of the m ranks. Activations, the KV caches of the generation
servers and allocator slack are not counted (realhf/base/memory_budget.py leaves 20% for them).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from realhf.impl.engine.tensor_parallel import COLWISE, ROWWISE

GIB = 2**30

# Published config values of the two models (their config.json on the hub), nothing downloaded.
MODELS = {
    "Qwen2.5-7B": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
    ),
    "Qwen2.5-32B": dict(
        hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
        num_key_value_heads=8, vocab_size=152064, tie_word_embeddings=False,
    ),
}  # fmt: skip
LAYOUTS = [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (2, 4), (8, 2), (4, 4), (1, 8), (8, 8)]


@dataclass
class ParamSplit:
    split: int  # parameters tensor parallelism divides over m (the layers' projections)
    whole: int  # parameters every tp rank holds (embeddings, norms, LM head, biases of rows)


def param_split(model: torch.nn.Module) -> ParamSplit:
    """Parameters by whether tensor parallelism splits them (a tied weight counted once)."""
    split = whole = 0
    suffixes = tuple(f".{n}.weight" for n in COLWISE + ROWWISE) + tuple(f".{n}.bias" for n in COLWISE)
    for name, p in model.named_parameters():
        if name.endswith(suffixes):
            split += p.numel()
        else:
            whole += p.numel()
    return ParamSplit(split, whole)


def bytes_per_rank(params: ParamSplit, dp: int, tp: int, weight_bytes: int = 4, ref_bytes: int = 4) -> Dict[str, float]:
    """GiB one trainer rank holds at layout d`dp`m`tp`: the actor in `weight_bytes` per weight
    (fp32 master weights, `actor.dtype`'s default: 4) with same-size gradients and two fp32 Adam
    moments, and a frozen reference in `ref_bytes` (fp32 by default: 4; `ref.dtype=bfloat16`: 2;
    0 without one, `ppo.kl_ctl=0`)."""
    local = params.split / (dp * tp) + params.whole / dp
    actor = local * (2 * weight_bytes + 8)
    ref = local * ref_bytes
    return {"actor_gib": actor / GIB, "ref_gib": ref / GIB, "total_gib": (actor + ref) / GIB}


def meta_model(**config) -> torch.nn.Module:
    with torch.device("meta"):
        return Qwen2ForCausalLM(Qwen2Config(**config))


def table() -> List[Tuple[str, str, Dict[str, float], float]]:
    rows = []
    for name, config in MODELS.items():
        params = param_split(meta_model(**config))
        total = (params.split + params.whole) / 1e9
        for dp, tp in LAYOUTS:
            if config["num_key_value_heads"] % tp:
                continue  # the key/value heads must divide by m
            rows.append((name, f"d{dp}m{tp}", bytes_per_rank(params, dp, tp), total))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs/scaling.md table")
    args = parser.parse_args()
    rows = table()
    if args.markdown:
        print("| model | trainer layout | GPUs | actor GiB / GPU | reference GiB / GPU | total GiB / GPU |")
        print("|---|---|---|---|---|---|")
    for name, layout, gib, billions in rows:
        dp, tp = (int(x) for x in layout[1:].split("m"))
        if args.markdown:
            print(
                f"| {name} ({billions:.2f}B) | {layout}p1 | {dp * tp} | {gib['actor_gib']:.1f} | "
                f"{gib['ref_gib']:.1f} | {gib['total_gib']:.1f} |"
            )
        else:
            print(
                f"{name:12s} {layout:6s} actor {gib['actor_gib']:7.1f} GiB  ref {gib['ref_gib']:6.1f}  total {gib['total_gib']:7.1f}"
            )


if __name__ == "__main__":
    main()
