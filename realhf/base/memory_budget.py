"""Will it fit? What a setting asks of a device's memory, checked before the allocation, so a
run that cannot fit fails at start naming the settings that size it (not as an allocator error
minutes later, with no hint which of the trainer, the reference or the KV cache took the memory).

On a GPU the free memory is what the driver reports, capped by this process's share when the
GPU is shared (torch.cuda.set_per_process_memory_fraction: cluster.gpu_placement=shared).
"""

from __future__ import annotations

from typing import Tuple

import torch

GIB = 2**30
# Room left for what no estimate counts: activations, allocator fragmentation, CUDA's context.
HEADROOM = 0.8


def free_memory(device: torch.device) -> Tuple[int, str]:
    """(bytes this process may still allocate on `device`, a name for it in errors)."""
    if device.type == "cpu":
        import psutil

        return psutil.virtual_memory().available, "this host"
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, total = torch.cuda.mem_get_info(index)
    where = f"GPU {index} ({torch.cuda.get_device_name(index)})"
    fraction = (
        torch.cuda.get_per_process_memory_fraction(index)
        if hasattr(torch.cuda, "get_per_process_memory_fraction")
        else 1.0
    )
    if fraction < 1.0:
        free = min(free, int(fraction * total) - torch.cuda.memory_reserved(index))
        where += f", this process's share {fraction:.2f} of {total / GIB:.0f} GiB"
    return max(free, 0), where


def check_fits(what: str, need: int, free: int, where: str, fix: str, headroom: float = HEADROOM) -> None:
    """Raise MemoryError when `need` bytes exceed `headroom` of `free`; the message names `fix`."""
    if need > headroom * free:
        raise MemoryError(
            f"{what} needs {need / GIB:.1f} GiB, {where} has {free / GIB:.1f} GiB free "
            f"({headroom:.0%} of it may be planned): {fix}"
        )


def check_device_fits(what: str, need: int, device: torch.device, fix: str) -> None:
    if device.type not in ("cpu", "cuda"):  # the meta device (tests) allocates nothing
        return
    free, where = free_memory(device)
    check_fits(what, need, free, where, fix)


def trainer_bytes(model: torch.nn.Module, trainable: bool, shards: int) -> int:
    """A trainer engine's resident bytes: weights, and for a trained model its gradients and
    AdamW's two fp32 moments per trainable weight, each divided over `shards` FSDP ranks."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    if not trainable:
        return weights // shards
    learned = [p for p in model.parameters() if p.requires_grad]
    grads = sum(p.numel() * p.element_size() for p in learned)
    adam = sum(p.numel() * 8 for p in learned)
    return (weights + grads + adam) // shards
