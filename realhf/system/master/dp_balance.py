"""Re-split one train step's prompt groups across the data-parallel ranks.

Each DP rank holds the groups that happened to arrive at it; a group stays whole and has an integer
cost (tokens the trainer computes for it). The step is as slow as its busiest rank, so we want
equal per-rank totals, while shipping as little cost as possible between ranks.

  1. Partition: Karmarkar–Karp's largest differencing method (k-way). It is much closer to the
     optimum than greedy longest-first on few, uneven items, and it is O(n log n).
  2. Placement: a partition says which groups belong together, not where. Any bin can go to any
     rank at the same balance, so bins are matched to ranks to maximise the cost that is already
     in place (an exact assignment problem, Hungarian algorithm, O(k^3)).
  3. Safety: if the partition's busiest bin is no lighter than the busiest rank as it is,
     moving buys nothing, so nothing moves.

`imbalance` = max rank cost / mean rank cost: 1.0 is perfect, 2.0 means the busiest rank does
twice its share (so the step takes twice as long as a perfect split would).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import List, Sequence, Tuple

_Bin = Tuple[int, List[int]]  # (sum of costs, item indices)


def _sorted_bins(bins: List[_Bin]) -> List[_Bin]:
    # Sorting on the indices too keeps equal-sum bins in a fixed order, hence a deterministic result.
    return sorted(bins, key=lambda b: (-b[0], b[1]))


def karmarkar_karp(costs: Sequence[int], k: int) -> List[List[int]]:
    """Indices of `costs` split into k bins (some may be empty) by the Karmarkar–Karp largest
    differencing method; each bin's indices ascending; deterministic (ties broken by index)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if any(c < 0 for c in costs):
        raise ValueError("costs must be >= 0")
    if not costs:
        return [[] for _ in range(k)]
    # Heap entries: (-spread, tie-break counter, bins sorted by sum descending).
    heap = []
    for i, c in enumerate(costs):
        bins = [(c, [i])] + [(0, []) for _ in range(k - 1)]
        heap.append((-c, i, bins))
    heapq.heapify(heap)
    counter = itertools.count(len(costs))
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        # Heaviest with lightest cancels the largest differences first: that is the method's idea.
        merged = _sorted_bins([(a[j][0] + b[-1 - j][0], a[j][1] + b[-1 - j][1]) for j in range(k)])
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], next(counter), merged))
    return [sorted(idx) for _, idx in heap[0][2]]


def _max_weight_matching(weight: List[List[int]]) -> List[int]:
    """row -> column of a square matrix maximising the summed weight (Hungarian, O(k^3))."""
    n = len(weight)
    cost = [[-w for w in row] for row in weight]  # the algorithm minimises
    inf = float("inf")
    u, v = [0] * (n + 1), [0] * (n + 1)
    match = [0] * (n + 1)  # match[col] = row, both 1-based; 0 = free
    for row in range(1, n + 1):
        match[0], col0 = row, 0
        minv, used, way = [inf] * (n + 1), [False] * (n + 1), [0] * (n + 1)
        while match[col0]:
            used[col0] = True
            r, delta, col1 = match[col0], inf, 0
            for j in range(1, n + 1):
                if not used[j]:
                    cur = cost[r - 1][j - 1] - u[r] - v[j]
                    if cur < minv[j]:
                        minv[j], way[j] = cur, col0
                    if minv[j] < delta:
                        delta, col1 = minv[j], j
            for j in range(n + 1):
                if used[j]:
                    u[match[j]] += delta
                    v[j] -= delta
                else:
                    minv[j] -= delta
            col0 = col1
        while col0:  # flip the augmenting path
            col1 = way[col0]
            match[col0] = match[col1]
            col0 = col1
    result = [0] * n
    for col in range(1, n + 1):
        result[match[col] - 1] = col - 1
    return result


def _imbalance(costs: Sequence[int]) -> float:
    total = sum(costs)
    return 1.0 if total == 0 else max(costs) * len(costs) / total


@dataclass(frozen=True)
class BalancePlan:
    assignment: List[List[Tuple[int, int]]]  # per destination rank: sorted (source rank, index)
    rank_costs: List[int]  # per destination rank, after balancing
    costs_before: List[int]  # per rank, as the groups arrived
    moved_cost: int  # cost of the groups that change rank

    @property
    def imbalance(self) -> float:
        return _imbalance(self.rank_costs)

    @property
    def imbalance_before(self) -> float:
        return _imbalance(self.costs_before)


def balance(costs_by_rank: Sequence[Sequence[int]]) -> BalancePlan:
    """costs_by_rank[r][i]: cost of the i-th group rank r holds. See the module docstring."""
    k = len(costs_by_rank)
    if k < 1:
        raise ValueError("need at least one rank")
    origin = [(r, i) for r, row in enumerate(costs_by_rank) for i in range(len(row))]
    flat = [costs_by_rank[r][i] for r, i in origin]
    before = [sum(row) for row in costs_by_rank]
    bins = karmarkar_karp(flat, k)
    bin_costs = [sum(flat[j] for j in b) for b in bins]
    if max(bin_costs) >= max(before):
        identity = [[(r, i) for i in range(len(row))] for r, row in enumerate(costs_by_rank)]
        return BalancePlan(identity, list(before), list(before), 0)
    kept = [[sum(flat[j] for j in b if origin[j][0] == r) for r in range(k)] for b in bins]
    rank_of_bin = _max_weight_matching(kept)
    assignment: List[List[Tuple[int, int]]] = [[] for _ in range(k)]
    rank_costs = [0] * k
    for b, r in enumerate(rank_of_bin):
        assignment[r] = sorted(origin[j] for j in bins[b])
        rank_costs[r] = bin_costs[b]
    moved = sum(flat) - sum(kept[b][r] for b, r in enumerate(rank_of_bin))
    return BalancePlan(assignment, rank_costs, list(before), moved)
