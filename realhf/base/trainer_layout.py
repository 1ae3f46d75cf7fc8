"""Which trainer rank is which: the layout of `allocation_mode`'s trainer part `d<dp>m<tp>p<pp>`.

Ranks are laid out (pp, dp, tp), tp innermost — the order of the engine's device mesh
(realhf.impl.engine.fsdp_engine) — so rank = p·dp·tp + d·tp + t. The ranks with the same d form
one replica of the model (its tp·pp ranks split the layers and the stages) and train the same
batch; the replica's rank with p = t = 0 is its head: it receives the trajectories, takes part in
the exchange of groups between replicas, and hands each step's batch to the rest of its replica.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple


@dataclass(frozen=True)
class TrainerLayout:
    dp: int = 1
    tp: int = 1
    pp: int = 1

    @classmethod
    def of(cls, world: int, tp: int = 1, pp: int = 1) -> "TrainerLayout":
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise ValueError(f"{world} trainer ranks do not divide into tp={tp} x pp={pp}")
        return cls(world // (tp * pp), tp, pp)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> Tuple[int, int, int]:
        """(dp rank, tp rank, pp rank) of `rank`."""
        return (rank // self.tp) % self.dp, rank % self.tp, rank // (self.dp * self.tp)

    def head(self, dp_rank: int) -> int:
        return dp_rank * self.tp

    def heads(self) -> List[int]:
        return [self.head(d) for d in range(self.dp)]

    def replica(self, dp_rank: int) -> List[int]:
        """The ranks of replica `dp_rank`, its head first."""
        return [p * self.dp * self.tp + dp_rank * self.tp + t for p in range(self.pp) for t in range(self.tp)]
