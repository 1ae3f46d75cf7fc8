"""Specification of the staleness rule (docs/architecture.md §4), realhf.system.manager.staleness.

Per trainer DP rank r, with share_r of the B groups of a step:

    capacity_r = min(max_concurrent_rollouts − running,
                     (η + v + 1)·share_r − (accepted_r − stale_dropped_r + running_r))

The single-rank tests (shares = [B]) are the original rule; the per-rank ones follow them.
"""

import itertools
import threading

import pytest

from realhf.system.manager.staleness import Decision, StalenessManager, dp_shares, resumed_accepted

LARGE = 10**6


class FakeTrainer:
    """A version source whose version the test sets by hand."""

    def __init__(self, version=0):
        self.version = version

    def get_version(self):
        return self.version


def manager(eta=0, batch_size=4, max_concurrent=LARGE, version=0):
    trainer = FakeTrainer(version)
    return StalenessManager(max_concurrent, [batch_size], eta, trainer), trainer


_qids = itertools.count()


def allocate_until_refused(mgr, n_clients=5, rank=0):
    """Clients take turns allocating fresh qids for `rank` until every one of them is refused;
    returns the number admitted. Nothing finishes meanwhile."""
    admitted = 0
    refused = set()
    while len(refused) < n_clients:
        for client in range(n_clients):
            if client in refused:
                continue
            if mgr.allocate(f"client{client}-{next(_qids)}", rank).success:
                admitted += 1
            else:
                refused.add(client)
    return admitted


# ---------------------------------------------------------------------------------------------
# The reference numbers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "eta, admitted_at_v0, cumulative_at_v1",
    [
        # B = 4, nothing finishes: at v = 0 the bound is (η + 1)·4 → 4, 8, 20;
        # at v = 1 it is (η + 2)·4 → 8, 12, 24 (max_concurrent_rollouts large, 5 clients).
        (0, 4, 8),
        (1, 8, 12),
        (4, 20, 24),
    ],
)
def test_admission_allows_eta_plus_version_plus_one_batches(eta, admitted_at_v0, cumulative_at_v1):
    mgr, trainer = manager(eta=eta, batch_size=4)
    assert allocate_until_refused(mgr) == admitted_at_v0
    trainer.version = 1
    assert admitted_at_v0 + allocate_until_refused(mgr) == cumulative_at_v1


def test_synchronous_ppo_admits_exactly_one_batch_per_version():
    # η = 0: a new batch of B opens only when the version advances.
    mgr, trainer = manager(eta=0, batch_size=3)
    for version in range(3):
        trainer.version = version
        batch = [f"v{version}-{i}" for i in range(3)]
        assert all(mgr.allocate(q, 0).success for q in batch)
        assert mgr.allocate(f"v{version}-extra", 0) == Decision(False, "staleness")
        for q in batch:
            mgr.finish(q, accepted=True)
        assert mgr.capacity() == 0


# ---------------------------------------------------------------------------------------------
# Decisions and their reasons
# ---------------------------------------------------------------------------------------------


def test_max_concurrent_rollouts_caps_running_rollouts():
    mgr, _ = manager(eta=100, batch_size=4, max_concurrent=3)
    assert [mgr.allocate(q, 0).success for q in "abcd"] == [True, True, True, False]
    assert mgr.allocate("e", 0) == Decision(False, "max_concurrent_rollouts")
    mgr.finish("a", accepted=True)
    assert mgr.allocate("e", 0) == Decision(True, "ok")


def test_staleness_refusal_says_staleness():
    mgr, _ = manager(eta=0, batch_size=1)
    assert mgr.allocate("a", 0) == Decision(True, "ok")
    assert mgr.allocate("b", 0) == Decision(False, "staleness")


def test_concurrency_is_reported_when_both_limits_bind():
    mgr, _ = manager(eta=0, batch_size=2, max_concurrent=2)
    mgr.allocate("a", 0), mgr.allocate("b", 0)
    assert mgr.allocate("c", 0).reason == "max_concurrent_rollouts"


def test_a_running_qid_cannot_be_admitted_twice():
    mgr, _ = manager(eta=4)
    assert mgr.allocate("q", 0).success
    assert mgr.allocate("q", 0) == Decision(False, "duplicate_qid")
    mgr.finish("q", accepted=True)
    assert mgr.allocate("q", 0).success  # finished qids may be reused


def test_rejections_are_counted_by_reason():
    mgr, _ = manager(eta=0, batch_size=1)
    mgr.allocate("a", 0)
    mgr.allocate("a", 0)
    mgr.allocate("b", 0)
    mgr.allocate("c", 0)
    assert mgr.status()["rejections"] == {"max_concurrent_rollouts": 0, "staleness": 2, "duplicate_qid": 1}


# ---------------------------------------------------------------------------------------------
# Finishing, filtering, dying, stale drops
# ---------------------------------------------------------------------------------------------


def test_accepted_groups_keep_counting_against_the_staleness_bound():
    # η = 0, B = 4: four accepted groups use up version 0's whole budget.
    mgr, _ = manager(eta=0, batch_size=4)
    for q in "abcd":
        mgr.allocate(q, 0)
        mgr.finish(q, accepted=True)
    assert mgr.capacity() == 0
    assert not mgr.allocate("e", 0).success


def test_filtered_group_frees_its_slot_and_is_not_counted():
    # η = 0, B = 4: 2 accepted + 2 filtered → capacity 4 − 2 = 2.
    mgr, _ = manager(eta=0, batch_size=4)
    for q in "abcd":
        mgr.allocate(q, 0)
    mgr.finish("a", accepted=True)
    mgr.finish("b", accepted=True)
    mgr.finish("c", accepted=False)
    mgr.finish("d", accepted=False)
    assert mgr.status()["accepted"] == 2
    assert mgr.capacity() == 2


def test_abandoned_rollout_frees_its_slot():
    mgr, _ = manager(eta=0, batch_size=2)
    mgr.allocate("a", 0), mgr.allocate("b", 0)
    assert mgr.capacity() == 0
    mgr.abandon("a")
    assert mgr.capacity() == 1
    assert mgr.status()["accepted"] == 0


@pytest.mark.parametrize("end", ["finish", "abandon"])
def test_ending_an_unknown_qid_raises_key_error_naming_it(end):
    mgr, _ = manager()
    call = (lambda q: mgr.finish(q, accepted=True)) if end == "finish" else mgr.abandon
    with pytest.raises(KeyError, match="ghost-qid"):
        call("ghost-qid")
    mgr.allocate("q", 0)
    call("q")
    with pytest.raises(KeyError, match="'q'"):
        call("q")  # ending twice is a bug too


def test_stale_drops_free_admission_capacity():
    # η = 0, B = 4: 4 accepted → capacity 0; the trainer drops 3 as stale → capacity 3.
    mgr, _ = manager(eta=0, batch_size=4)
    for q in "abcd":
        mgr.allocate(q, 0)
        mgr.finish(q, accepted=True)
    mgr.set_stale_dropped([3])
    assert mgr.capacity() == 3
    assert mgr.status()["stale_dropped"] == 3


def test_stale_dropped_is_a_monotonic_total():
    mgr, _ = manager()
    mgr.set_stale_dropped([5])
    mgr.set_stale_dropped([5])
    with pytest.raises(ValueError, match="monotonic"):
        mgr.set_stale_dropped([4])


def test_status_reports_the_numbers_that_explain_admission():
    mgr, trainer = manager(eta=1, batch_size=4, max_concurrent=6, version=2)
    mgr.allocate("a", 0), mgr.allocate("b", 0)
    mgr.finish("a", accepted=True)
    # (1 + 2 + 1)·4 − (1 − 0 + 1) = 14; 6 − 1 = 5 → capacity 5
    assert mgr.status() == {
        "version": 2,
        "running": 1,
        "accepted": 1,
        "stale_dropped": 0,
        "rejections": {"max_concurrent_rollouts": 0, "staleness": 0, "duplicate_qid": 0},
        "capacity": 5,
        "per_rank": {"share": [4], "running": [1], "accepted": [1], "stale_dropped": [0], "capacity": [5]},
        "max_concurrent_rollouts": 6,
        "batch_size": 4,
        "max_head_offpolicyness": 1,
    }


@pytest.mark.parametrize("args", [(8, [0], 0), (8, [], 0), (8, [4, 0], 0)])
def test_invalid_shares_are_rejected(args):
    with pytest.raises(ValueError):
        StalenessManager(*args, FakeTrainer())


# ---------------------------------------------------------------------------------------------
# Recovery
# ---------------------------------------------------------------------------------------------


def test_loaded_state_gives_the_same_capacity_and_never_overshoots():
    mgr, trainer = manager(eta=1, batch_size=4, version=1)
    for q in range(7):
        mgr.allocate(q, 0)
    for q in range(4):
        mgr.finish(q, accepted=q % 2 == 0)
    mgr.set_stale_dropped([1])
    saved = mgr.state_dict()

    restored, _ = manager(eta=1, batch_size=4, version=1)
    restored.load_state_dict(saved)
    assert restored.capacity() == mgr.capacity()
    assert restored.status() == mgr.status()
    # (1 + 1 + 1)·4 − (2 − 1 + 3) = 8 more, and not one more than that.
    assert allocate_until_refused(restored, n_clients=1) == 8


def test_in_flight_rollouts_of_a_loaded_state_can_finish_or_be_abandoned():
    mgr, _ = manager(eta=0, batch_size=2)
    mgr.allocate("a", 0), mgr.allocate("b", 0)
    restored, _ = manager(eta=0, batch_size=2)
    restored.load_state_dict(mgr.state_dict())
    assert restored.running_qids() == {"a", "b"}
    restored.finish("a", accepted=True)
    for qid in restored.running_qids():  # e.g. rollouts lost in the restart
        restored.abandon(qid)
    assert restored.capacity() == 1


# ---------------------------------------------------------------------------------------------
# Thread safety
# ---------------------------------------------------------------------------------------------


def run_threads(n, target):
    start = threading.Barrier(n)

    def body(i):
        start.wait()
        target(i)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrent_allocations_admit_exactly_the_bound():
    # η = 2, B = 7, v = 0: exactly (2 + 0 + 1)·7 = 21 of 16×50 concurrent attempts succeed.
    mgr, _ = manager(eta=2, batch_size=7)
    successes = []

    def client(i):
        successes.extend(q for q in range(50) if mgr.allocate((i, q), 0).success)

    run_threads(16, client)
    assert len(successes) == 21
    assert mgr.status()["running"] == 21
    assert mgr.status()["rejections"]["staleness"] == 16 * 50 - 21


def test_concurrent_churn_never_exceeds_max_concurrent_rollouts():
    # Clients allocate and release as fast as they can. A client counts a slot only after its
    # allocation succeeded and uncounts it before releasing, so `held` never exceeds what the
    # manager has admitted: its peak must stay within the cap.
    mgr, _ = manager(eta=LARGE, batch_size=1, max_concurrent=5)
    held = 0
    peak = 0
    lock = threading.Lock()

    def client(i):
        nonlocal held, peak
        for q in range(300):
            qid = (i, q)
            if mgr.allocate(qid, 0).success:
                with lock:
                    held += 1
                    peak = max(peak, held)
                with lock:
                    held -= 1
                mgr.finish(qid, accepted=False)

    run_threads(12, client)
    assert 1 <= peak <= 5
    status = mgr.status()
    assert status["running"] == 0 and status["accepted"] == 0


def test_a_resumed_manager_counts_the_trained_groups_so_capacity_continues_not_overshoots():
    # Resumed at version 5 with B = 4, η = 1 after 20 groups were trained: the same room as a
    # manager that ran all along and whose groups were all trained — (η + 1)·B — not (η + v + 1)·B.
    trainer = FakeTrainer(version=5)
    resumed = StalenessManager(LARGE, [4], 1, trainer, accepted=[20])
    fresh = StalenessManager(LARGE, [4], 1, trainer)
    assert resumed.capacity() == 8
    assert fresh.capacity() == 28  # what forgetting the counters would admit at once
    assert allocate_until_refused(resumed) == 8
    with pytest.raises(ValueError, match="accepted must be one count >= 0 per DP rank"):
        StalenessManager(LARGE, [4], 1, trainer, accepted=[-1])


# ---------------------------------------------------------------------------------------------
# One budget per trainer DP rank
# ---------------------------------------------------------------------------------------------


def ranked(eta=1, shares=(4, 4), max_concurrent=LARGE, version=0, accepted=None):
    trainer = FakeTrainer(version)
    return StalenessManager(max_concurrent, list(shares), eta, trainer, accepted=accepted), trainer


def test_each_dp_rank_gets_its_share_of_b_with_the_remainder_to_the_first_ranks():
    assert dp_shares(16, 2) == [8, 8]
    assert dp_shares(10, 4) == [3, 3, 2, 2]
    assert dp_shares(8, 1) == [8]
    with pytest.raises(ValueError, match="dp_size"):
        dp_shares(8, 0)
    with pytest.raises(ValueError, match="every DP rank needs at least one group"):
        dp_shares(2, 4)


def test_a_rank_that_filled_its_budget_is_refused_while_the_other_rank_is_still_admitted():
    # The observed deadlock (η = 1, B = 8, DP = 2): a fast worker's rank 1 took 13 of the global
    # (1 + 0 + 1)·8 = 16 and rank 0 stayed short of its 4. Per rank, rank 1 gets (1 + 0 + 1)·4 = 8
    # and rank 0 keeps its own 8.
    mgr, _ = ranked(eta=1, shares=[4, 4])
    for i in range(8):
        assert mgr.allocate(f"r1-{i}", 1).success
        mgr.finish(f"r1-{i}", accepted=True)
    assert mgr.allocate("r1-more", 1) == Decision(False, "staleness")
    assert mgr.capacity(1) == 0 and mgr.capacity(0) == 8
    assert allocate_until_refused(mgr, rank=0) == 8
    status = mgr.status()
    assert status["per_rank"]["accepted"] == [0, 8] and status["per_rank"]["running"] == [8, 0]
    assert status["per_rank"]["capacity"] == [0, 0] and status["capacity"] == 0


def test_the_version_advances_every_rank_budget_by_its_share():
    mgr, trainer = ranked(eta=0, shares=[3, 2])
    assert allocate_until_refused(mgr, rank=0) == 3 and allocate_until_refused(mgr, rank=1) == 2
    trainer.version = 1
    assert [mgr.capacity(0), mgr.capacity(1)] == [3, 2] and mgr.capacity() == 5


def test_stale_drops_of_a_rank_free_that_ranks_budget_only():
    mgr, _ = ranked(eta=0, shares=[2, 2])
    for rank in (0, 1):
        for i in range(2):
            mgr.allocate(f"{rank}-{i}", rank)
            mgr.finish(f"{rank}-{i}", accepted=True)
    assert mgr.status()["per_rank"]["capacity"] == [0, 0]
    mgr.set_stale_dropped([0, 2])
    assert mgr.status()["per_rank"]["capacity"] == [0, 2]
    assert mgr.allocate("x", 0) == Decision(False, "staleness")
    assert mgr.allocate("y", 1).success
    assert mgr.status()["stale_dropped"] == 2 and mgr.stale_dropped() == [0, 2]


def test_stale_dropped_is_monotonic_per_rank_and_has_one_total_per_rank():
    mgr, _ = ranked(shares=[2, 2])
    mgr.set_stale_dropped([3, 1])
    with pytest.raises(ValueError, match="stale_dropped of rank 1 is a monotonic total: got 0 after 1"):
        mgr.set_stale_dropped([4, 0])  # the total grew; rank 1's count did not
    with pytest.raises(ValueError, match="one total per trainer DP rank"):
        mgr.set_stale_dropped([5])


def test_concurrency_is_shared_by_all_ranks():
    mgr, _ = ranked(eta=10, shares=[4, 4], max_concurrent=3)
    assert mgr.allocate("a", 0).success and mgr.allocate("b", 1).success and mgr.allocate("c", 1).success
    assert mgr.allocate("d", 0) == Decision(False, "max_concurrent_rollouts")


@pytest.mark.parametrize("rank", [-1, 2, 7, True, "0", 0.0])
def test_an_out_of_range_rank_is_a_value_error_naming_the_range(rank):
    mgr, _ = ranked(shares=[4, 4])
    with pytest.raises(ValueError, match=r"rank must be a trainer DP rank in \[0, 2\)"):
        mgr.allocate("q", rank)
    with pytest.raises(ValueError, match="rank must be"):
        mgr.capacity(rank)
    assert mgr.status()["running"] == 0


def test_finish_and_abandon_count_against_the_rank_the_qid_was_admitted_for():
    mgr, _ = ranked(eta=0, shares=[2, 2])
    mgr.allocate("a", 1), mgr.allocate("b", 1), mgr.allocate("c", 0)
    mgr.finish("a", accepted=True)
    mgr.finish("c", accepted=False)
    mgr.abandon("b")
    per_rank = mgr.status()["per_rank"]
    assert per_rank["accepted"] == [0, 1] and per_rank["running"] == [0, 0] and per_rank["capacity"] == [2, 1]


def test_a_resumed_run_starts_each_rank_at_version_times_its_share():
    # Resumed at v = 2 after 2·8 trained groups, shares [5, 3], η = 1: each rank has (η + 1)·share_r.
    shares = [5, 3]
    accepted = resumed_accepted(shares, 16)
    assert accepted == [10, 6]
    mgr, _ = ranked(eta=1, shares=shares, version=2, accepted=accepted)
    assert [mgr.capacity(0), mgr.capacity(1)] == [10, 6]
    assert allocate_until_refused(mgr, rank=1) == 6
    with pytest.raises(ValueError, match="trained_groups_at_start=12 is not a whole number of steps of B=8"):
        resumed_accepted(shares, 12)
    with pytest.raises(ValueError, match="one count >= 0 per DP rank"):
        ranked(shares=shares, accepted=[10])


def test_per_rank_state_round_trips_and_a_state_of_another_dp_size_is_refused():
    mgr, _ = ranked(eta=1, shares=[2, 2], version=1)
    mgr.allocate("a", 0), mgr.allocate("b", 1), mgr.allocate("c", 1)
    mgr.finish("b", accepted=True)
    mgr.set_stale_dropped([0, 1])
    saved = mgr.state_dict()
    assert saved["accepted"] == [0, 1] and saved["stale_dropped"] == [0, 1]

    restored, _ = ranked(eta=1, shares=[2, 2], version=1)
    restored.load_state_dict(saved)
    assert restored.status() == mgr.status()
    restored.finish("c", accepted=True)  # the rank comes back with the qid
    assert restored.status()["per_rank"]["accepted"] == [0, 2]

    other, _ = ranked(shares=[4])
    with pytest.raises(ValueError, match="accepted has 2 ranks, this manager 1"):
        other.load_state_dict(saved)


def test_with_one_rank_capacity_is_the_single_budget_rule_on_random_event_sequences():
    import random

    rng = random.Random(0)
    for _ in range(20):
        eta, b, cap = rng.randint(0, 3), rng.randint(1, 6), rng.randint(1, 30)
        mgr, trainer = manager(eta=eta, batch_size=b, max_concurrent=cap)
        running, accepted, dropped = set(), 0, 0
        for step in range(200):
            op = rng.random()
            if op < 0.5:
                q = f"q{step}"
                old_rule = min(
                    cap - len(running), (eta + trainer.version + 1) * b - (accepted - dropped + len(running))
                )
                assert mgr.allocate(q, 0).success == (old_rule > 0)
                if old_rule > 0:
                    running.add(q)
            elif op < 0.8 and running:
                q = running.pop()
                ok = rng.random() < 0.8
                mgr.finish(q, accepted=ok)
                accepted += ok
            elif op < 0.9:
                dropped = min(accepted, dropped + rng.randint(0, 2))
                mgr.set_stale_dropped([dropped])
            else:
                trainer.version += 1
            expected = min(cap - len(running), (eta + trainer.version + 1) * b - (accepted - dropped + len(running)))
            assert mgr.capacity() == mgr.capacity(0) == expected
