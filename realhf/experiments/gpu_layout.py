"""The run's GPUs from its root config: how many a node lends (`gpus_per_node`) and where each
generation server and trainer rank computes (`run_placement`, `realhf.base.placement` applied to
`cluster.*`). Validation and the experiment builder both ask here, so they agree."""

from __future__ import annotations

from realhf.api.cli_args import AsyncPPOConfig
from realhf.base.allocation_mode import AllocationMode
from realhf.base.device_names import torch_built_for_gpu
from realhf.base.placement import Placement, place


def gpus_per_node(cfg: AsyncPPOConfig) -> int:
    """`cluster.n_gpus_per_node`, or, when it is 0 and `cluster.device` asks for a GPU ('cuda', or
    'auto' on a machine where torch sees one), the GPUs torch sees here. 0 with `cluster.device=cpu`:
    the whole run is on the CPU then."""
    cluster = cfg.cluster
    if cluster.device == "cpu":
        return 0
    if cluster.n_gpus_per_node > 0:
        return cluster.n_gpus_per_node
    if cluster.device == "cuda" or torch_built_for_gpu():
        import torch  # here: a CPU-only build (the check above) spares the launcher its import

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 0


def run_placement(cfg: AsyncPPOConfig, alloc: AllocationMode) -> Placement:
    """Every generation server's and trainer rank's slot; AllocationModeError if they do not fit.
    Under Ray each process of a role takes the role's smallest memory share (Placement.role_shares):
    Ray, not the placement's indices, decides which GPU a process gets."""
    c = cfg.cluster
    placement = place(alloc, c.n_nodes, gpus_per_node(cfg), c.gpu_placement, c.gen_memory_fraction)
    return placement.role_shares() if c.launcher == "ray" else placement
