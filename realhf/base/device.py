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

from realhf.base.device_names import DEVICE_NAMES

_GPU = "cuda"


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """The device `cluster.device=name` means for the process of local rank `local_rank`."""
    if name not in DEVICE_NAMES:
        raise ValueError(f"cluster.device must be one of {', '.join(DEVICE_NAMES)}, got {name!r}")
    has_gpu = gpu_available()
    if name == _GPU and not has_gpu:
        raise ValueError(
            f"cluster.device={_GPU} but torch sees no GPU on this machine "
            f"(torch {torch.__version__}); set cluster.device=cpu or auto"
        )
    if name == "cpu" or not has_gpu:
        return torch.device("cpu")
    n_gpus = torch.cuda.device_count()
    if not 0 <= local_rank < n_gpus:
        raise ValueError(
            f"GPU index {local_rank} does not exist: this node has {n_gpus} GPUs "
            f"(cluster.device={name}); allocation_mode places more processes on it than it has GPUs"
        )
    return torch.device(_GPU, local_rank)


def why_device(name: str, device: torch.device) -> str:
    """Why `pick_device(name, ...)` gave `device`, for the one log line each process writes."""
    if name == "cpu":
        return "cluster.device=cpu"
    if device.type == "cpu":
        return f"cluster.device={name} and torch {torch.__version__} sees no GPU"
    n = torch.cuda.device_count()
    return f"cluster.device={name}: torch {torch.__version__} sees {n} GPU{'s' if n != 1 else ''}, {torch.cuda.get_device_name(device)}"


def bind_device(device: torch.device) -> None:
    """Make `device` this process's current GPU (FSDP's device mesh and NCCL use the current
    one); nothing to do on the CPU."""
    if device.type == _GPU:
        torch.cuda.set_device(device)


def cap_memory(device: torch.device, fraction: float) -> None:
    """Hold this process to `fraction` of `device`'s memory: its share of a GPU it shares with
    another process (realhf.base.placement), so neither starves the other. Nothing to do on the
    CPU or with a GPU of its own (fraction 1)."""
    if device.type == _GPU and fraction < 1.0:
        torch.cuda.set_per_process_memory_fraction(fraction, device)


def dist_backend(device: torch.device) -> str:
    """The torch.distributed backend for collectives on `device`: NCCL on a GPU, gloo on the CPU."""
    return "nccl" if device.type == _GPU else "gloo"


def gpu_available() -> bool:
    """Whether torch sees a GPU this process could use."""
    return torch.cuda.is_available()


def rng_state(device: torch.device) -> dict:
    """This process's torch RNG state (the CPU generator, and `device`'s when it is a GPU)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == _GPU:
        state["device"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == _GPU and "device" in state:
        torch.cuda.set_rng_state(state["device"], device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks of the default process group (unchanged without one), returned
    on `t`'s device. NCCL reduces only GPU tensors, so a CPU tensor travels to this process's
    GPU and back when the group is NCCL."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return t
    on = t
    if dist.get_backend() == "nccl" and t.device.type != _GPU:
        on = t.to(torch.device(_GPU, torch.cuda.current_device()))
    dist.all_reduce(on)
    return on.to(t.device) if on is not t else t
