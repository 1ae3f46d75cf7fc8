"""Specification of the rule that keeps a late-joining generation server out of routing until it
holds the trainer's current weights (realhf/system/manager/joining.py), of how the manager applies
it (realhf/system/manager/manager_service.py), and of the trainer's side: which joiners are in the
weight group (realhf/system/trainer/weight_broadcast.py, JoinerSitOut)."""

import logging

from helpers.manager_harness import manager_config
from realhf.base.trial_files import published_version_dir
from realhf.system.manager.joining import JoinGate, Routed
from realhf.system.manager.manager_service import ManagerService
from realhf.system.trainer.weight_broadcast import MAX_SIT_OUT, JoinerSitOut, Members

A, B, C = "http://a:1", "http://b:1", "http://c:1"


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _gate(timeout=10.0, max_behind=8):
    clock = Clock()
    return JoinGate(timeout, max_behind, clock), clock


# ---- the gate ------------------------------------------------------------------------------------
def test_a_joiner_behind_the_trainer_waits_while_another_server_is_routed_then_is_routed_at_the_current_version():
    gate, clock = _gate()
    gate.arrive(B, 2)
    assert gate.admit(current=5, others_routed=True, current_on_disk=True) == []
    clock.now += 3
    gate.report(B, 4)
    assert gate.admit(5, True, False) == [] and gate.joining() == [B]
    clock.now += 1.5
    gate.report(B, 5)
    assert gate.admit(5, True, False) == [Routed(B, 5, 4.5, current=True)]
    assert gate.joining() == []


def test_a_joiner_that_holds_the_version_of_when_it_was_asked_is_current_though_the_trainer_moved_on():
    """Steps of 0.1 s: by the time its answer is in, the trainer announced newer versions, which
    the broadcast gave it too. Comparing with the newer reading would keep it out for good."""
    gate, _ = _gate()
    gate.arrive(B, 7, asked_at=11)
    gate.report(B, 49, asked_at=50)  # not yet in the weight group at that moment
    assert gate.admit(53, others_routed=True, current_on_disk=False) == []
    gate.report(B, 51, asked_at=51)
    assert gate.admit(54, True, False) == [Routed(B, 51, 0.0, current=True)]


def test_a_joiner_at_or_beyond_the_current_version_is_routed_at_once():
    gate, _ = _gate()
    gate.arrive(A, 5)
    gate.arrive(B, 6)  # the trainer's broadcast reached it before the manager read the new version
    assert [r.url for r in gate.admit(5, True, True)] == [A, B]


def test_a_reported_version_never_goes_back_and_an_unknown_one_counts_as_the_initial_weights():
    gate, _ = _gate()
    gate.arrive(A, None)  # SGLang's "default"
    assert gate.joiners[A].version == 0
    gate.report(A, 3)
    gate.report(A, 1)  # an older probe answering late
    gate.report(A, None)
    assert gate.joiners[A].version == 3
    gate.report(C, 9)  # not joining: nothing to record
    assert gate.joining() == [A]


def test_with_no_other_server_routed_a_joiner_is_routed_at_once_when_the_current_version_is_not_on_disk():
    """Every server restarted: the trainer makes the next version only from rollouts, so holding
    the joiner back would stall the run for good."""
    gate, _ = _gate()
    gate.arrive(A, 1)
    assert gate.admit(5, others_routed=False, current_on_disk=False) == [Routed(A, 1, 0.0, current=False)]


def test_with_no_other_server_routed_a_joiner_too_far_behind_for_its_groups_to_train_waits_for_the_current_version():
    """Found by the chaos run: the only server restarted at version 0 with the trainer at 71 and
    η = 2, was routed, and made nothing but groups dropped as stale. It waits for the version the
    trainer sends it while it waits for data (the master's catch_up)."""
    gate, clock = _gate(max_behind=2)
    gate.arrive(A, 0)
    gate.arrive(B, 3)
    assert gate.admit(5, others_routed=False, current_on_disk=False) == [Routed(B, 3, 0.0, current=False)]
    clock.now += 100
    assert gate.admit(5, False, False) == [] and gate.joining() == [A]
    gate.report(A, 5, asked_at=5)
    assert gate.admit(5, False, False) == [Routed(A, 5, 100.0, current=True)]


def test_with_no_other_server_routed_and_the_version_on_disk_a_joiner_is_updated_first_but_not_past_the_timeout():
    gate, clock = _gate(timeout=10.0)
    gate.arrive(A, 1)
    gate.arrive(B, 1)
    assert gate.admit(5, others_routed=False, current_on_disk=True) == []
    gate.report(A, 5)  # its update from disk went through
    assert [r.url for r in gate.admit(5, False, True)] == [A]
    clock.now += 10  # B's update keeps failing: routed anyway rather than no server at all
    assert gate.admit(5, False, True) == [Routed(B, 1, 10.0, current=False)]


def test_an_overdue_joiner_is_reported_at_1_2_4_times_the_timeout_and_stays_unrouted_while_others_serve():
    gate, clock = _gate(timeout=10.0)
    gate.arrive(A, 0)
    reported = []
    for _ in range(50):
        clock.now += 1
        reported += [round(j.waited(clock.now)) for j in gate.overdue()]
        assert gate.admit(3, others_routed=True, current_on_disk=False) == []
    assert reported == [10, 20, 40] and gate.joining() == [A]


def test_a_joiner_that_leaves_joins_afresh_when_it_comes_back():
    gate, clock = _gate()
    gate.arrive(A, 4)
    clock.now += 30
    gate.leave(A)
    gate.leave(A)  # twice is harmless
    assert not gate.is_joining(A)
    gate.arrive(A, 0)  # restarted at the same address
    assert gate.joiners[A].version == 0 and gate.joiners[A].waited(clock.now) == 0


# ---- the manager -----------------------------------------------------------------------------------
def _service(urls, **overrides):
    return ManagerService(manager_config(**{"n_servers": max(len(urls), 1), **overrides}), urls)


def test_the_manager_routes_a_late_server_only_once_its_weights_are_current_and_says_so(caplog):
    service = _service([A], weight_sync="distributed")
    service.observe_trainer(3, [0])
    service.observe_servers([A])
    service.observe_health(B, ok=True, weight_version=1)  # a restarted server, at an older version
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            service.observe_servers([A, B])
    assert service.router.servers() == [A]
    assert service.joining_servers() == [B]  # the trainer's weight group takes it
    assert service.updater.versions[B] == 1  # the update round sees it behind
    assert [j["url"] for j in service.status()["joining"]] == [B]
    service.observe_health(B, ok=True, weight_version=3, asked_at=3)  # the broadcast reached it
    with caplog.at_level(logging.INFO):
        service.observe_servers([A, B])
    assert service.router.servers() == [A, B] and service.joining_servers() == []
    assert service.status()["joining"] == [] and service.status()["servers_joined"] == 1
    routed = [r.getMessage() for r in caplog.records if "routed after waiting" in r.getMessage()]
    assert len(routed) == 1 and B in routed[0] and "reported version 3," in routed[0], routed


def test_a_version_the_disk_update_loaded_routes_the_joiner(tmp_path):
    service = _service([A], weight_sync="disk", run_dir=str(tmp_path))
    published_version_dir(str(tmp_path), "actor", 2).mkdir(parents=True)
    service.observe_trainer(2, [0])
    service.observe_health(B, ok=True, weight_version=0)
    service.observe_servers([A, B])
    assert service.router.servers() == [A] and service.update_due()
    service.updater.versions[B] = 2  # what WeightUpdater.run_round does after /update_weights_from_disk
    service.updater.on_served(B, 2, 2)
    service.observe_servers([A, B])
    assert sorted(service.router.servers()) == [A, B]


def test_a_joiner_that_is_never_current_stays_unrouted_and_is_logged_naming_what_it_waits_for(caplog):
    service = _service([A], weight_sync="distributed", join_timeout=0.01)
    service.observe_trainer(4, [0])
    service.observe_health(B, ok=True, weight_version=0)
    service.joins.clock = lambda: 1e12  # long past the timeout
    with caplog.at_level(logging.WARNING):
        service.observe_servers([A, B])
    assert service.router.servers() == [A]
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"generation server {B} has waited" in warning and "the trainer's next broadcast" in warning
    assert "version 4 is not on disk" in warning


def test_when_the_only_server_restarts_behind_it_is_routed_rather_than_stalling_the_run(caplog):
    service = _service([A], weight_sync="distributed")
    service.observe_trainer(4, [0])
    for _ in range(2):
        service.observe_health(A, ok=False)
    service.observe_servers([A])
    assert service.router.servers() == []
    service.observe_health(A, ok=True, weight_version=2)  # restarted from an older version on disk
    with caplog.at_level(logging.WARNING):
        service.observe_servers([A])
    assert service.router.servers() == [A]
    assert any("no other server is routed" in r.getMessage() for r in caplog.records)


def test_when_the_only_server_restarts_too_far_behind_it_waits_for_the_trainers_weights_and_says_so(caplog):
    service = _service([A], weight_sync="distributed", max_head_offpolicyness=0, join_timeout=0.01)
    service.observe_trainer(4, [0])
    for _ in range(2):
        service.observe_health(A, ok=False)
    service.observe_servers([A])
    service.observe_health(A, ok=True, weight_version=0)  # the initial weights: nothing newer on disk
    service.joins.clock = lambda: 1e12  # long past the timeout
    with caplog.at_level(logging.WARNING):
        service.observe_servers([A])
    assert service.router.servers() == [] and service.joining_servers() == [A]
    warning = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "version 4 sent again while the trainer waits for data" in warning, warning
    service.observe_health(A, ok=True, weight_version=4, asked_at=4)  # the trainer's catch-up reached it
    service.observe_servers([A])
    assert service.router.servers() == [A]


def test_a_dropped_joiner_leaves_the_gate_and_the_weight_group():
    service = _service([A], weight_sync="distributed", max_health_failures=1)
    service.observe_trainer(2, [0])
    service.observe_health(B, ok=True, weight_version=0)
    service.observe_servers([A, B])
    assert service.joining_servers() == [B] and service.is_joining(B)
    service.observe_health(B, ok=False)
    service.observe_servers([A, B])
    assert service.joining_servers() == [] and B not in service.updater.versions
    service.observe_health(C, ok=True, weight_version=0)
    service.forget_unregistered([A])
    assert service.joining_servers() == []


# ---- the trainer's weight group --------------------------------------------------------------------
def test_joiners_are_members_of_the_weight_group_with_the_routed_servers():
    sit_out = JoinerSitOut()
    assert sit_out.members(Members([B, A], [C]), version=1) == [A, B, C]
    assert sit_out.members(Members([A]), version=1) == [A]


def test_a_joiner_whose_broadcast_failed_sits_out_1_2_4_versions_and_is_forgotten_once_routed():
    sit_out = JoinerSitOut()
    m = Members([A], [C])
    assert sit_out.record([C], {C: "refused"}, version=1) == [C]
    assert sit_out.members(m, 2) == [A]  # sits out version 2
    assert sit_out.members(m, 3) == [A, C]
    sit_out.record([C], {C: "refused"}, version=3)
    assert [sit_out.members(m, v) for v in (4, 5, 6)] == [[A], [A], [A, C]]
    sit_out.record([C], {C: "refused"}, version=6)
    assert C not in sit_out.members(m, 10) and C in sit_out.members(m, 11)
    assert sit_out.members(Members([A, C]), 7) == [A, C]  # routed now (brought up from disk): a member
    assert sit_out.sitting_out() == []


def test_the_sit_out_is_capped_and_a_success_clears_it():
    sit_out = JoinerSitOut()
    m = Members([], [C])
    for v in range(20):
        sit_out.record([C], {C: "refused"}, version=v)
    assert sit_out.members(m, 19 + MAX_SIT_OUT) == [] and sit_out.members(m, 20 + MAX_SIT_OUT) == [C]
    sit_out.record([C], {}, version=100)
    assert sit_out.members(m, 101) == [C]


def test_a_failure_that_names_a_routed_server_costs_the_joiners_nothing_one_that_names_none_counts_against_them():
    sit_out = JoinerSitOut()
    m = Members([A], [B, C])
    assert sit_out.record([B, C], {A: "connection refused", "(broadcast)": "peer closed"}, version=1) == []
    assert sit_out.members(m, 2) == [A, B, C]
    assert sit_out.record([B, C], {"(rank 0)": "rendezvous timed out"}, version=2) == [B, C]
    assert sit_out.members(m, 3) == [A]
