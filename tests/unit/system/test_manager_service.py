"""The GserverManager's logic without sockets (realhf/system/manager_service.py): what the
watcher's observations change in routing and weight versions."""

from realhf.api.worker_configs import GserverManagerConfig
from realhf.system.manager_service import ManagerService

A, B = "http://a:1", "http://b:1"


def _service(urls, **overrides):
    return ManagerService(GserverManagerConfig(**{"n_servers": max(len(urls), 1), **overrides}), urls)


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
    service.observe_trainer(2, 1)
    service.observe_trainer(1, 0)  # an older read (another replica of name resolve) changes nothing
    s = service.status()
    assert s["version"] == 2 and s["stale_dropped"] == 1
