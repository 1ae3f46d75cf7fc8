"""The one place a device is chosen: `cluster.device` and a local rank → a torch device, and the
torch.distributed backend that device needs.

    "auto"  CUDA (`cuda:<local rank>`) when a GPU is visible, else the CPU
    "cpu"   the CPU, also on a GPU node
    "cuda"  `cuda:<local rank>`; refused on a machine without a GPU

Everything else in realhf asks this module, so a CPU run and a GPU run take the same code path
and differ only in what `pick_device` returned.
"""

from __future__ import annotations

import torch

DEVICE_NAMES = ("auto", "cpu", "cuda")
_GPU = "cuda"


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """The device `cluster.device=name` means for the process of local rank `local_rank`."""
    if name not in DEVICE_NAMES:
        raise ValueError(f"cluster.device must be one of {', '.join(DEVICE_NAMES)}, got {name!r}")
    has_gpu = torch.cuda.is_available()
    if name == _GPU and not has_gpu:
        raise ValueError(f"cluster.device={_GPU} but torch sees no GPU on this machine "
                         f"(torch {torch.__version__}); set cluster.device=cpu or auto")
    if name == "cpu" or not has_gpu:
        return torch.device("cpu")
    n_gpus = torch.cuda.device_count()
    if not 0 <= local_rank < n_gpus:
        raise ValueError(f"local rank {local_rank} has no GPU: this node has {n_gpus} "
                         f"(cluster.device={name}); start at most {n_gpus} trainer processes per node")
    return torch.device(_GPU, local_rank)


def bind_device(device: torch.device) -> None:
    """Make `device` this process's current GPU (FSDP's device mesh and NCCL use the current
    one); nothing to do on the CPU."""
    if device.type == _GPU:
        torch.cuda.set_device(device)


def dist_backend(device: torch.device) -> str:
    """The torch.distributed backend for collectives on `device`: NCCL on a GPU, gloo on the CPU."""
    return "nccl" if device.type == _GPU else "gloo"
