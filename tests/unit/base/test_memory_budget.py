"""Memory asked of a device is checked before it is allocated: the KV cache of a generation
server and a trainer engine's weights, gradients and AdamW states, on the CPU and (the same
code, with the driver's numbers) on a GPU."""

import pytest
import torch

from helpers.paths import TINY_MATH
from realhf.api.cli_args import ModelTrainEvalConfig
from realhf.base import memory_budget
from realhf.base.memory_budget import GIB, check_fits, free_memory, trainer_bytes
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig


def test_a_request_over_the_headroom_names_what_asked_where_and_the_fix():
    check_fits("x", need=int(7.9 * GIB), free=10 * GIB, where="GPU 0 (H200)", fix="lower y")
    with pytest.raises(
        MemoryError, match=r"the cache needs 8\.1 GiB, GPU 0 \(H200\) has 10\.0 GiB free \(80% .*\): lower y"
    ):
        check_fits("the cache", need=int(8.1 * GIB), free=10 * GIB, where="GPU 0 (H200)", fix="lower y")


def test_the_cpu_budget_is_the_hosts_available_memory():
    free, where = free_memory(torch.device("cpu"))
    assert free > 0 and where == "this host"


def test_a_trained_engine_counts_weights_gradients_and_two_adam_moments_divided_over_its_shards():
    model = torch.nn.Sequential(torch.nn.Linear(10, 10), torch.nn.Linear(10, 10, bias=False).requires_grad_(False))
    n_trained, n_frozen = 110, 100
    assert trainer_bytes(model, trainable=True, shards=1) == (n_trained + n_frozen) * 4 + n_trained * (4 + 8)
    assert trainer_bytes(model, trainable=True, shards=2) == ((n_trained + n_frozen) * 4 + n_trained * 12) // 2
    assert trainer_bytes(model, trainable=False, shards=1) == (n_trained + n_frozen) * 4
    assert trainer_bytes(model.to(torch.bfloat16), trainable=False, shards=1) == (n_trained + n_frozen) * 2


def test_an_engine_that_cannot_fit_is_refused_before_it_reaches_the_device(monkeypatch):
    monkeypatch.setattr(memory_budget, "free_memory", lambda device: (1000, "GPU 0 (test)"))
    engine = FSDPEngine(
        FSDPEngineConfig(
            model=ModelTrainEvalConfig(path=f"{TINY_MATH}/sft"),
            device="cpu",
            name="actor",
            micro_batch_tokens=1024,
            shared_prompt=False,
        )
    )
    with pytest.raises(
        MemoryError, match=r"the actor engine .*weights, gradients and AdamW states.*allocation_mode.*actor\.lora"
    ):
        engine.initialize()
    engine.destroy()
    assert engine.model is None
