"""The GserverManager's logic without sockets (realhf/system/manager/manager_service.py): what the
watcher's observations change in routing, weight versions and admission."""

import pytest

from helpers.manager_harness import manager_config
from realhf.system.manager.manager_service import ManagerService

A, B = "http://a:1", "http://b:1"


def _service(urls, **overrides):
    return ManagerService(manager_config(**{"n_servers": max(len(urls), 1), **overrides}), urls)


def test_a_server_dropped_by_health_checks_leaves_routing_and_returns_at_the_version_it_reports():
    service = _service([A, B], max_health_failures=2)
    for _ in range(2):
        service.observe_health(A, ok=False)
    service.observe_servers([A, B])
    assert service.router.servers() == [B]
    assert service.status()["unhealthy_servers"] == [A] and service.status()["servers_dropped"] == 1
    service.observe_health(A, ok=True, weight_version=3)  # restarted, loaded version 3 itself
    service.observe_servers([A, B])
    assert sorted(service.router.servers()) == [A, B] and service.updater.versions[A] == 3


def test_the_trainer_version_and_stale_drops_only_ever_grow():
    service = _service([A])
    service.observe_trainer(2, [1])
    service.observe_trainer(1, [0])  # an older read (another replica of name resolve) changes nothing
    s = service.status()
    assert s["version"] == 2 and s["stale_dropped"] == 1


def test_stale_drops_are_merged_per_rank_and_a_list_of_another_dp_size_is_an_error():
    service = _service([A], n_trainer_ranks=2)
    service.observe_trainer(0, [2, 0])
    service.observe_trainer(0, [1, 3])  # rank 0's read is older: each rank keeps its largest total
    assert service.status()["per_rank"]["stale_dropped"] == [2, 3]
    with pytest.raises(ValueError, match="stale_dropped for 1 DP ranks.*budgets 2.*n_trainer_ranks"):
        service.observe_trainer(0, [5])


def test_each_trainer_rank_has_its_own_budget_of_its_share():
    # B = 8 over 2 ranks, η = 0: 4 per rank; rank 1 full does not refuse rank 0.
    service = _service([A], n_trainer_ranks=2, groups_per_step=8, max_head_offpolicyness=0, max_concurrent_rollouts=100)
    assert [service.allocate(f"r1-{i}", 1)["success"] for i in range(5)] == [True] * 4 + [False]
    assert service.allocate("r0", 0) == {"success": True, "reason": "ok"}
    assert service.status()["per_rank"]["share"] == [4, 4]
    with pytest.raises(ValueError, match=r"rank must be a trainer DP rank in \[0, 2\), got 2"):
        service.allocate("r2", 2)


def test_a_resumed_manager_starts_each_rank_at_the_trained_steps_times_its_share():
    service = _service([A], n_trainer_ranks=2, groups_per_step=8, max_head_offpolicyness=1, trained_groups_at_start=24)
    service.observe_trainer(3, [0, 0])
    s = service.status()
    assert s["per_rank"]["accepted"] == [12, 12] and s["per_rank"]["capacity"] == [8, 8]
