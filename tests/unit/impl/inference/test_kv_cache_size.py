"""A KV cache the host cannot hold is refused before it is allocated, naming the settings that size it."""

import pytest
import torch

from realhf.impl.inference.transformer import check_cache_fits


def test_a_cache_larger_than_free_memory_names_context_length_and_slots():
    # SmolLM2-135M at its 8192-token context with 256 slots: 90 GiB of keys and values.
    with pytest.raises(
        MemoryError,
        match=r"256 slots x 8192 tokens x 30 layers needs 90\.0 GiB.*"
        r"gen_server\.native\.context_length.*max_running_requests",
    ):
        check_cache_fits((30, 256, 3, 8192, 64), torch.float32, torch.device("cpu"))


def test_a_cache_sized_for_the_task_passes():
    check_cache_fits((30, 64, 3, 192, 64), torch.float32, torch.device("cpu"))  # 0.57 GB
