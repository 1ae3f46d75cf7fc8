"""realhf.base.device on this GPU-less machine: the one place `cluster.device` becomes a torch device."""

import pytest
import torch

from realhf.base.device import cap_memory, dist_backend, pick_device

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="asserts what a machine without a GPU does")


def test_auto_picks_the_cpu_when_no_gpu_is_visible():
    assert pick_device("auto", local_rank=0) == torch.device("cpu")
    assert pick_device("auto", local_rank=3) == torch.device("cpu")


def test_cpu_is_the_cpu():
    assert pick_device("cpu") == torch.device("cpu")


def test_a_gpu_device_without_a_gpu_is_refused_naming_cluster_device():
    with pytest.raises(ValueError, match=r"cluster\.device=cuda .*no GPU.*cluster\.device=cpu or auto"):
        pick_device("cuda", local_rank=0)


def test_an_unknown_device_name_is_refused_listing_the_choices():
    with pytest.raises(ValueError, match=r"cluster\.device must be one of auto, cpu, cuda, got 'gpu'"):
        pick_device("gpu")


def test_the_cpu_collectives_run_on_gloo():
    assert dist_backend(torch.device("cpu")) == "gloo"


def test_gpu_collectives_run_on_nccl():
    assert dist_backend(torch.device("cuda", 0)) == "nccl"


def test_a_shared_gpu_caps_this_process_memory_and_a_whole_one_or_the_cpu_does_not(monkeypatch):
    capped = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: capped.append((f, d)))
    cap_memory(torch.device("cuda", 1), 0.5)
    assert capped == [(0.5, torch.device("cuda", 1))]
    cap_memory(torch.device("cuda", 0), 1.0)  # its GPU alone
    cap_memory(torch.device("cpu"), 0.5)  # the CPU has no cap
    assert len(capped) == 1
