"""Specification of the manager's server-health rule (realhf/system/manager/server_health.py): which
generation servers are routed to, from the results of the /health checks."""

from realhf.system.manager.server_health import DROPPED, UP, ServerHealth

A, B = "http://a:1", "http://b:1"


def test_a_server_is_dropped_after_max_health_failures_in_a_row_and_back_after_one_success():
    health = ServerHealth([A, B], max_failures=3)
    assert [health.record(A, ok=False) for _ in range(3)] == [None, None, DROPPED]
    assert health.routable([A, B]) == [B] and health.n_dropped == 1
    assert health.record(A, ok=False) is None  # already out: not dropped twice
    assert health.n_dropped == 1
    assert health.record(A, ok=True) == UP
    assert health.routable([A, B]) == [A, B] and health.failures == {}


def test_a_success_resets_the_count_so_only_consecutive_failures_drop():
    health = ServerHealth([A], max_failures=2)
    for _ in range(5):
        assert health.record(A, ok=False) is None
        assert health.record(A, ok=True) is None
    assert health.routable([A]) == [A] and health.n_dropped == 0


def test_initial_servers_are_trusted_and_others_join_after_one_success_at_the_version_they_report():
    health = ServerHealth([A], max_failures=2)
    assert health.routable([A, B]) == [A]
    assert not health.is_joining(A) and health.is_joining(B)
    assert health.record(B, ok=True, weight_version=7) == UP
    assert health.routable([B, A]) == [B, A] and health.reported_versions == {B: 7}


def test_a_nonsense_reported_version_is_ignored():
    health = ServerHealth([], max_failures=2)
    for version in (-1, "default", None):
        health.record(A, ok=True, weight_version=version)
    assert health.reported_versions == {} and health.routable([A]) == [A]


def test_a_server_no_longer_registered_is_forgotten():
    health = ServerHealth([A, B], max_failures=5)
    health.record(B, ok=False)
    health.forget_unregistered([])
    assert health.routable([A, B]) == [] and health.failures == {}
    assert health.is_joining(A)  # if it registers again, it joins like a new server
