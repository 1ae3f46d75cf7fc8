"""scripts/memory_per_device.py: the scaling page's memory table counts what the engines hold."""

import pytest
import torch

from helpers.fsdp_ranks import engine_config, open_engines
from realhf.base.memory_budget import trainer_bytes
from scripts.memory_per_device import GIB, bytes_per_rank, meta_model, param_split, table


def test_at_m1_the_table_is_what_the_engines_memory_check_counts():
    with open_engines(engine_config()) as (engine,):
        split = param_split(engine.model)
        for dp in (1, 2, 4):
            want = trainer_bytes(engine.model, True, dp) + trainer_bytes(engine.model, False, dp)
            got = bytes_per_rank(split, dp, 1)["total_gib"] * GIB
            assert got == pytest.approx(want, rel=1e-6)


def test_the_split_is_the_projections_tensor_parallelism_divides():
    """On the tiny model: 2 layers x (q, k, v, o: 128x128 + q/k/v biases; gate, up, down: 128x512)."""
    with open_engines(engine_config()) as (engine,):
        split = param_split(engine.model)
        layer = 4 * 128 * 128 + 3 * 128 + 3 * 128 * 512
        assert split.split == 2 * layer
        assert split.split + split.whole == sum(p.numel() for p in engine.model.parameters())
    half = bytes_per_rank(split, 1, 2)["actor_gib"]
    assert bytes_per_rank(split, 1, 1)["actor_gib"] > half > bytes_per_rank(split, 2, 1)["actor_gib"]


def test_the_published_sizes_of_the_two_models_come_out():
    sizes = {name: billions for name, _, _, billions in table()}
    assert sizes["Qwen2.5-7B"] == pytest.approx(7.62, abs=0.01)
    assert sizes["Qwen2.5-32B"] == pytest.approx(32.76, abs=0.01)
    layouts = {(n, layout) for n, layout, _, _ in table()}
    assert ("Qwen2.5-7B", "d1m8") not in layouts  # 4 key/value heads do not divide by 8
    assert meta_model(**{"hidden_size": 64, "num_attention_heads": 4}).model.embed_tokens.weight.device == torch.device(
        "meta"
    )
