"""`cluster.gpu_placement`: which GPUs each generation server and each trainer DP rank computes on.

    separate  servers on GPUs [0, G), trainer ranks on [G, G + T): every process has its GPUs alone
    shared    servers from GPU 0, trainer ranks from GPU 0: where a server and a trainer rank meet
              on a GPU, the server may use `gen_memory_fraction` of its memory, the rank the rest
    auto      separate when it fits, else shared

G = gen.dp · gen.tp · gen.pp (each server holds tp·pp GPUs), T = train.dp (one GPU per rank).
GPUs are counted over the nodes: global index = node · n_gpus_per_node + local index, and a
process's GPUs lie on one node. With n_gpus_per_node = 0 every process runs on the CPU.

Pure (no torch, no I/O): `realhf.experiments` asks once per run and hands each worker its slot.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Tuple

from realhf.base.allocation_mode import AllocationMode, AllocationModeError

PLACEMENT_MODES = ("auto", "separate", "shared")
# What to tell a user whose processes do not fit, whatever the mode.
_MORE_GPUS = "raise cluster.n_nodes or cluster.n_gpus_per_node, or lower the d (or m, p) of allocation_mode"


@dataclass(frozen=True)
class Slot:
    """Where one process computes: `gpus` are local indices on `node`, () on the CPU."""

    node: int
    gpus: Tuple[int, ...]
    memory_fraction: float = 1.0  # of each of its GPUs' memory; 1.0: it has them alone

    def __str__(self) -> str:
        if not self.gpus:
            return "CPU"
        share = f" ({self.memory_fraction:g} of memory)" if self.memory_fraction < 1 else ""
        return f"node {self.node} GPU {','.join(map(str, self.gpus))}{share}"


@dataclass(frozen=True)
class Placement:
    mode: str  # what was placed: "separate", "shared" or "cpu" (never "auto")
    servers: Tuple[Slot, ...]  # generation server i
    trainer: Tuple[Slot, ...]  # trainer DP rank r

    def describe(self) -> List[str]:
        """One line per role, for the launch log."""
        return [
            f"gpu placement {self.mode}: generation servers "
            + "; ".join(f"{i}: {s}" for i, s in enumerate(self.servers)),
            f"gpu placement {self.mode}: trainer ranks " + "; ".join(f"{r}: {s}" for r, s in enumerate(self.trainer)),
        ]

    def role_shares(self) -> "Placement":
        """The same GPUs, every process of a role at the role's smallest memory fraction. For a
        launcher that picks each process's GPU itself (Ray hands out fractions of GPUs, not the
        indices above): a process asks it for its share and keeps to it, so whichever processes
        the launcher puts on one GPU fit there."""
        return replace(self, servers=_at_smallest(self.servers), trainer=_at_smallest(self.trainer))


def place(
    alloc: AllocationMode, n_nodes: int, n_gpus_per_node: int, mode: str = "auto", gen_memory_fraction: float = 0.5
) -> Placement:
    """Every generation server's and trainer rank's slot; AllocationModeError if they cannot go
    where `mode` asks (the message names the GPUs each role needs, the cluster and what to change)."""
    if n_nodes < 1 or n_gpus_per_node < 0:
        raise ValueError(f"need n_nodes >= 1 and n_gpus_per_node >= 0, got {n_nodes} and {n_gpus_per_node}")
    if mode not in PLACEMENT_MODES:
        raise ValueError(f"cluster.gpu_placement={mode!r}: choose one of {list(PLACEMENT_MODES)}")
    if not 0 < gen_memory_fraction < 1:
        raise ValueError(f"cluster.gen_memory_fraction must lie in (0, 1), got {gen_memory_fraction}")

    def fail(problem: str) -> None:
        raise AllocationModeError(str(alloc), problem, show_grammar=False)

    if n_gpus_per_node == 0:
        if alloc.gen_engine == "sglang":
            fail(
                f"the {alloc.gen_engine} engine needs GPUs but n_gpus_per_node=0; on a CPU machine use the "
                f"native engine or vLLM's CPU build, e.g. 'native.{alloc.gen}+{alloc.train}'"
            )
        cpu = Slot(node=0, gpus=())
        return Placement("cpu", (cpu,) * alloc.gen.dp, (cpu,) * alloc.train.world_size)

    per_server = alloc.gen.tp * alloc.gen.pp
    G, T = alloc.gen.world_size, alloc.train.world_size
    total = n_nodes * n_gpus_per_node
    cluster = f"the cluster has {n_nodes} node(s) × {n_gpus_per_node} GPUs = {total}"
    if per_server > n_gpus_per_node:
        fail(
            f"each generation server needs {per_server} GPUs (m{alloc.gen.tp} × p{alloc.gen.pp}) on one node, but a "
            f"node has {n_gpus_per_node}; lower m or p, or use nodes with more GPUs"
        )
    if n_gpus_per_node % per_server and G > n_gpus_per_node:
        # Packed from GPU 0, some server would hold GPUs of two nodes.
        fail(
            f"{alloc.gen.dp} generation servers of {per_server} GPUs each do not divide into nodes of "
            f"{n_gpus_per_node} GPUs: a server's GPUs must lie on one node; choose m·p dividing n_gpus_per_node"
        )

    fits_separate, fits_shared = G + T <= total, max(G, T) <= total
    if mode == "separate" and not fits_separate:
        fail(
            f"cluster.gpu_placement=separate needs {G} GPUs for generation + {T} for the trainer = {G + T}, but "
            f"{cluster}; "
            + (f"cluster.gpu_placement=shared (or auto) fits them on {max(G, T)} GPUs, or " if fits_shared else "")
            + _MORE_GPUS
        )
    if mode == "shared" and not fits_shared:
        fail(
            f"cluster.gpu_placement=shared needs max({G} GPUs for generation, {T} for the trainer) = {max(G, T)}, "
            f"but {cluster}; {_MORE_GPUS}"
        )
    if mode == "auto" and not fits_shared:
        fail(
            f"needs {G} GPUs for generation and {T} for the trainer: {G + T} apart (cluster.gpu_placement=separate) "
            f"or {max(G, T)} shared (cluster.gpu_placement=shared), but {cluster}; {_MORE_GPUS}"
        )

    def slot(first: int, n: int, fraction: float) -> Slot:
        return Slot(first // n_gpus_per_node, tuple(g % n_gpus_per_node for g in range(first, first + n)), fraction)

    server_gpus = [range(i * per_server, (i + 1) * per_server) for i in range(alloc.gen.dp)]
    if mode == "separate" or (mode == "auto" and fits_separate):
        servers = tuple(slot(g.start, per_server, 1.0) for g in server_gpus)
        return Placement("separate", servers, tuple(slot(G + r, 1, 1.0) for r in range(T)))
    # Shared: trainer rank r on global GPU r; GPU g holds a server when g < G.
    servers = tuple(slot(g.start, per_server, gen_memory_fraction if g.start < T else 1.0) for g in server_gpus)
    trainer = tuple(slot(r, 1, 1 - gen_memory_fraction if r < G else 1.0) for r in range(T))
    return Placement("shared", servers, trainer)


def _at_smallest(slots: Tuple[Slot, ...]) -> Tuple[Slot, ...]:
    smallest = min((s.memory_fraction for s in slots), default=1.0)
    return tuple(replace(s, memory_fraction=smallest) for s in slots)
