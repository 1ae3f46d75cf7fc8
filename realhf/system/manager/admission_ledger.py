"""The manager's admission ledger: where every admitted rollout is, kept in name resolve (Redis).

Why: a manager holds the admission counts of the staleness rule (docs/architecture.md §4). Kept
only in memory, a restarted manager starts from zero: it over-admits, the surplus is trained
stale or dropped, and the rollouts its predecessor admitted are unknown to it. So every change is
written to one Redis hash, in one transaction, before the manager answers the request that made
it (~0.1 ms on loopback): a restarted manager reads back exactly what its predecessor had told
its clients, and the master reads the same record to account for every group.

    admitted         admissions so far (counted on its own, so that the balance below is a check)
    run/<qid>        the DP rank of a running rollout (admitted, not ended)
    accepted/<rank>  groups pushed to that DP rank (a resumed run starts from its trained groups)
    ended/<reason>   rollouts that ended without a group for the trainer (ENDED_REASONS)
    abandoned        rollouts whose worker died; their prompts run again under the same qid
    starts           how many managers started in this run (1: never restarted)

Every admission ends in exactly one of these, so at any moment

    admissions = Σ accepted + Σ ended + abandoned + running

(`balanced`), and `accounting()` checks that and the trainer's side (received = trained + stale-dropped +
malformed + duplicates + buffered). The record is deleted with the trial's other keys at the
next launch.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence

from realhf.base import name_resolve

# Why a rollout ended without a group for the trainer: a filter (the agent returned none), an
# error or timeout in the episode, a group the trainer would refuse, one too large to send, a
# prompt no server can answer (dropped once: beyond what validation scanned), a reward function
# that did not return within rollout.agent.reward_timeout.
ENDED_REASONS = ("filtered", "failed", "timed_out", "malformed", "too_large", "bad_prompt", "reward_timed_out")

_ADMITTED, _RUN, _ACCEPTED, _ENDED, _ABANDONED, _STARTS = (
    "admitted",
    "run/",
    "accepted/",
    "ended/",
    "abandoned",
    "starts",
)


@dataclasses.dataclass
class LedgerState:
    admitted: int  # admissions, this run's and (on a resumed run) the trained groups it starts from
    running: Dict[str, int]  # qid -> DP rank
    accepted: List[int]  # per DP rank
    ended: Dict[str, int]  # reason -> rollouts
    abandoned: int
    starts: int

    @property
    def balanced(self) -> bool:
        return self.admitted == sum(self.accepted) + sum(self.ended.values()) + self.abandoned + len(self.running)


class AdmissionLedger:
    """The record of one trial; each method is one atomic update of it."""

    def __init__(self, key: str, n_ranks: int):
        self.key, self.n_ranks = key, n_ranks

    def start(self, accepted_at_start: Sequence[int]) -> LedgerState:
        """Count this manager's start; the state to continue from. The first manager of a run
        writes `accepted_at_start` (a resumed run's trained groups per rank); a restarted one
        gets its predecessor's state back (starts > 1)."""
        state = self.load()
        if state.starts == 0:
            name_resolve.update_record(
                self.key,
                put={
                    **{f"{_ACCEPTED}{r}": int(n) for r, n in enumerate(accepted_at_start)},
                    _ADMITTED: sum(int(n) for n in accepted_at_start),
                },
            )
        name_resolve.update_record(self.key, incr={_STARTS: 1})
        return self.load()

    def admitted(self, qid: str, rank: int) -> None:
        name_resolve.update_record(self.key, put={_RUN + qid: int(rank)}, incr={_ADMITTED: 1})

    def ended(self, qid: str, rank: int, accepted: bool, reason: str) -> None:
        field = f"{_ACCEPTED}{rank}" if accepted else _ENDED + reason
        name_resolve.update_record(self.key, remove=[_RUN + qid], incr={field: 1})

    def abandoned(self, qids: Sequence[str]) -> None:
        if qids:
            name_resolve.update_record(self.key, remove=[_RUN + q for q in qids], incr={_ABANDONED: len(qids)})

    def load(self) -> LedgerState:
        return parse(name_resolve.get_record(self.key), self.n_ranks, self.key)


def parse(fields: Dict[str, str], n_ranks: int, key: str = "admission ledger") -> LedgerState:
    """The state a record holds; a field that does not parse, or a rank beyond `n_ranks` (a
    manager of another trainer DP size), is a ValueError naming it."""
    state = LedgerState(admitted=0, running={}, accepted=[0] * n_ranks, ended={}, abandoned=0, starts=0)
    for field, value in fields.items():
        try:
            n = int(value)
            if field.startswith(_RUN):
                state.running[field[len(_RUN) :]] = n
            elif field.startswith(_ACCEPTED):
                state.accepted[int(field[len(_ACCEPTED) :])] += n
            elif field.startswith(_ENDED):
                state.ended[field[len(_ENDED) :]] = n
            elif field == _ADMITTED:
                state.admitted = n
            elif field == _ABANDONED:
                state.abandoned = n
            elif field == _STARTS:
                state.starts = n
            else:
                raise ValueError("unknown field")
        except (ValueError, IndexError) as e:
            raise ValueError(
                f"{key}: field {field!r}={value!r} does not parse for a trainer of {n_ranks} DP ranks ({e})"
            ) from None
    bad = {q: r for q, r in state.running.items() if not 0 <= r < n_ranks}
    if bad:
        raise ValueError(
            f"{key}: running rollouts with a DP rank outside [0, {n_ranks}): {dict(list(bad.items())[:3])}"
        )
    return state


def accounting(state: LedgerState, trainer: Sequence[dict], accepted_at_start: Sequence[int]) -> dict:
    """Where every admitted group is, from the ledger and the DP heads' `fetch` replies (read
    after the ledger, and after the heads drained their streams, so every group accepted by then
    had its chance to arrive). `holds`: nothing vanished — each group the manager counted as
    accepted reached the trainer, and each that reached it was trained, dropped as stale or
    malformed, or is still buffered."""
    total = {
        k: sum(int(r.get(k, 0)) for r in trainer)
        for k in ("added", "taken", "stale_dropped", "invalid", "duplicates", "buffered")
    }
    arrived = total["added"] + total["invalid"]  # distinct groups (a duplicate was accepted once)
    accepted = sum(state.accepted) - sum(accepted_at_start)  # this run's, not the resumed run's
    balanced = total["added"] == total["taken"] + total["stale_dropped"] + total["buffered"]
    return {
        "admissions": state.admitted - sum(accepted_at_start),
        "accepted": accepted,
        "ended": dict(sorted(state.ended.items())),
        "abandoned": state.abandoned,
        "running": len(state.running),
        "manager_starts": state.starts,
        "arrived": arrived,
        "trained": total["taken"],
        "stale_dropped": total["stale_dropped"],
        "malformed": total["invalid"],
        "duplicates": total["duplicates"],
        "buffered": total["buffered"],
        "lost": max(0, accepted - arrived),
        "holds": state.balanced and balanced and arrived >= accepted,
    }


def accounting_line(a: dict) -> str:
    ended = ", ".join(f"{n} {reason}" for reason, n in a["ended"].items()) or "0"
    return (
        f"groups: {a['admissions']} admitted = {a['accepted']} accepted + {ended} ended without a group + "
        f"{a['abandoned']} abandoned by a dead worker + {a['running']} still running; {a['arrived']} arrived at the "
        f"trainer = {a['trained']} trained + {a['stale_dropped']} stale-dropped + {a['malformed']} malformed + "
        f"{a['buffered']} buffered ({a['duplicates']} duplicates refused); lost in transit: {a['lost']}; "
        f"manager starts: {a['manager_starts']}"
    )
