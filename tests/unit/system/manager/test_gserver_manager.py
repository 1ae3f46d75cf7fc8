"""Specification of the GserverManager over real HTTP (docs/architecture.md §4, §5; issue 3 item 2).

The manager app runs for real (uvicorn on 127.0.0.1, its watcher reading Redis); generation
servers are fake SGLang servers (tests/helpers/fake_sglang.py), also real HTTP.
"""

import asyncio
import os
import time

import aiohttp
import pytest

from helpers.http import http
from helpers.manager_harness import fake_servers, running_manager, set_version
from helpers.wait import wait_for
from realhf.base import name_resolve, names
from realhf.base.trial_files import published_version_dir

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("nr")]


async def _allocate_until_refused(url: str, n_clients: int, per_client: int, tag: str, rank: int = 0) -> int:
    """Each client allocates up to `per_client` rollouts for trainer rank `rank`, stopping at its
    first refusal."""

    async def client(session, c):
        n = 0
        for i in range(per_client):
            async with session.post(f"{url}/allocate_rollout", json={"qid": f"{tag}-c{c}-{i}", "rank": rank}) as r:
                assert r.status == 200
                if not (await r.json())["success"]:
                    break
                n += 1
        return n

    async with aiohttp.ClientSession() as session:
        return sum(await asyncio.gather(*(client(session, c) for c in range(n_clients))))


@pytest.mark.parametrize("eta,first,after_v1", [(0, 4, 8), (1, 8, 12), (4, 20, 24)])
def test_admission_with_nothing_finishing_admits_eta_plus_one_batches_then_one_more_per_version(eta, first, after_v1):
    # B = 4 prompt groups per train step, 5 clients of 4 slots each: min(4·5, (1 + η)·4) admissions
    # (AReaL v0.3: 4 / 8 / 20 for η = 0 / 1 / 4), then (2 + η)·4 cumulative at version 1.
    with (
        fake_servers(1) as servers,
        running_manager(
            [s.url for s in servers], groups_per_step=4, max_head_offpolicyness=eta, max_concurrent_rollouts=100
        ) as m,
    ):
        assert asyncio.run(_allocate_until_refused(m.url, 5, 4, "v0")) == first
        set_version(1)
        wait_for(lambda: http("GET", f"{m.url}/status")[1]["version"] == 1, 5, "the manager to read version 1")
        assert first + asyncio.run(_allocate_until_refused(m.url, 5, 4, "v1")) == after_v1
        _, status = http("GET", f"{m.url}/status")
        assert status["running"] == after_v1 and status["rejections"]["staleness"] > 0


def test_finished_and_filtered_rollouts_free_slots_and_only_accepted_ones_count():
    with (
        fake_servers(1) as servers,
        running_manager([s.url for s in servers], groups_per_step=2, max_head_offpolicyness=0) as m,
    ):
        for q in ("a", "b"):
            assert http("POST", f"{m.url}/allocate_rollout", {"qid": q, "rank": 0})[1] == {
                "success": True,
                "reason": "ok",
            }
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "c", "rank": 0})[1] == {
            "success": False,
            "reason": "staleness",
        }
        # A filtered group frees its slot and is not counted …
        assert http("POST", f"{m.url}/finish_rollout", {"qid": "a", "accepted": False, "n_tokens": 5}) == (
            200,
            {"success": True},
        )
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "c", "rank": 0})[1]["success"]
        # … an accepted one counts against the (η + v + 1)·B = 2 budget.
        http("POST", f"{m.url}/finish_rollout", {"qid": "b", "accepted": True, "n_tokens": 7})
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "d", "rank": 0})[1] == {
            "success": False,
            "reason": "staleness",
        }
        # The trainer reporting a stale drop gives the slot back.
        name_resolve.add(names.stale_dropped("rollout-test", "t0"), "[1]", replace=True)
        wait_for(lambda: http("GET", f"{m.url}/status")[1]["stale_dropped"] == 1, 5, "stale_dropped to be read")
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "d", "rank": 0})[1]["success"]
        _, status = http("GET", f"{m.url}/status")
        assert status["accepted"] == 1 and status["throughput"]["total_tokens"] == 12
        assert status["throughput"]["filtered"] == 1


def status_capacity(m):
    return http("GET", f"{m.url}/status")[1]["per_rank"]["capacity"]


def test_allocate_requires_a_rank_within_the_trainers_dp_size_and_says_so():
    with fake_servers(1) as servers, running_manager([s.url for s in servers], n_trainer_ranks=2) as m:
        for body, expected in [
            ({"qid": "q"}, "rank: Field required"),
            ({"qid": "q", "rank": -1}, "rank: Input should be greater than or equal to 0"),
            ({"qid": "q", "rank": 2}, "rank must be a trainer DP rank in [0, 2), got 2"),
            ({"qid": "q", "rank": "one"}, "rank: Input should be a valid integer"),
        ]:
            code, answer = http("POST", f"{m.url}/allocate_rollout", body)
            assert code == 422 and expected in answer["detail"], (body, code, answer)
        assert http("GET", f"{m.url}/status")[1]["running"] == 0
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "q", "rank": 1})[1]["success"]


def test_with_two_trainer_ranks_a_full_rank_does_not_starve_the_other_and_stale_drops_free_their_rank():
    # η = 1, B = 8, DP = 2 (the deadlock seen in a real run): each rank gets (1 + 0 + 1)·4 = 8.
    with (
        fake_servers(1) as servers,
        running_manager(
            [s.url for s in servers],
            n_trainer_ranks=2,
            groups_per_step=8,
            max_head_offpolicyness=1,
            max_concurrent_rollouts=100,
        ) as m,
    ):
        assert asyncio.run(_allocate_until_refused(m.url, 1, 10, "fast", rank=1)) == 8
        for i in range(4):  # half of the fast rank's groups finish and are pushed
            assert http("POST", f"{m.url}/finish_rollout", {"qid": f"fast-c0-{i}", "accepted": True})[0] == 200
        assert status_capacity(m) == [8, 0]
        assert asyncio.run(_allocate_until_refused(m.url, 3, 10, "slow", rank=0)) == 8
        # Rank 1 dropped 3 of its groups as stale: that room is rank 1's again, not rank 0's.
        name_resolve.add(names.stale_dropped("rollout-test", "t0"), "[0, 3]", replace=True)
        wait_for(lambda: status_capacity(m) == [0, 3], 5, "rank 1's stale drops to be read")
        _, status = http("GET", f"{m.url}/status")
        assert status["stale_dropped"] == 3 and status["per_rank"]["running"] == [8, 4]


def test_the_manager_fails_loudly_on_a_stale_dropped_value_that_is_not_a_list_per_rank():
    from realhf.system.manager.gserver_manager import read_stale_dropped

    key = names.stale_dropped("rollout-test", "t0")
    assert read_stale_dropped(key, 2) == [0, 0]  # nothing published yet
    name_resolve.add(key, "[1, 2]", replace=True)
    assert read_stale_dropped(key, 2) == [1, 2]
    for bad in ("3", "[1, -1]", "not json", '{"0": 1}'):
        name_resolve.add(key, bad, replace=True)
        with pytest.raises(ValueError, match="expected a JSON list of stale-dropped totals per trainer DP rank"):
            read_stale_dropped(key, 2)


def test_bad_request_bodies_get_4xx_with_a_message_never_5xx():
    with fake_servers(1) as servers, running_manager([s.url for s in servers]) as m:
        cases = [
            ("/allocate_rollout", {}),
            ("/allocate_rollout", {"qid": "q"}),
            ("/allocate_rollout", {"qid": "q", "rank": -1}),
            ("/allocate_rollout", {"qid": "q", "rank": 1}),
            ("/allocate_rollout", {"qid": 3, "rank": 0}),
            ("/allocate_rollout", {"qid": "", "rank": 0}),
            ("/schedule_request", {"qid": "q", "prompt_len": -1, "group_size": 1, "new_token_budget": 4}),
            ("/schedule_request", {"qid": "q", "prompt_len": 3, "group_size": 0, "new_token_budget": 4}),
            ("/finish_rollout", {"qid": "q"}),
            ("/finish_rollout", {"qid": "never-allocated", "accepted": True}),
        ]
        for path, body in cases:
            status, answer = http("POST", m.url + path, body)
            assert 400 <= status < 500, (path, body, status, answer)
            assert answer["detail"], (path, body)
        assert http("POST", m.url + "/allocate_rollout", "not a map")[0] == 422


def test_numbers_beyond_float_arithmetic_are_refused_and_the_status_page_keeps_answering():
    huge = 10**400  # a valid JSON integer that float() cannot hold
    with fake_servers(1) as servers, running_manager([s.url for s in servers]) as m:
        assert http("POST", m.url + "/allocate_rollout", {"qid": "q", "rank": 0})[1]["success"]
        cases = [
            ("/finish_rollout", {"qid": "q", "accepted": True, "n_tokens": huge}),
            ("/schedule_request", {"qid": "q", "prompt_len": huge, "group_size": 1, "new_token_budget": 4}),
            ("/schedule_request", {"qid": "q", "prompt_len": 3, "group_size": huge, "new_token_budget": 4}),
            ("/schedule_request", {"qid": "q", "prompt_len": 3, "group_size": 1, "new_token_budget": 2**64}),
            (
                "/schedule_request",
                {"qid": "q", "prompt_len": 3, "group_size": 1, "new_token_budget": 4, "previous_version": huge},
            ),
            ("/allocate_rollout", {"qid": "x" * 5000, "rank": 0}),
        ]
        for path, body in cases:
            status, answer = http("POST", m.url + path, body)
            assert status == 422, (path, status, answer)
            assert http("GET", m.url + "/status")[0] == 200
        # The refused finish left the rollout running; a sane one ends it.
        assert http("POST", m.url + "/finish_rollout", {"qid": "q", "accepted": True, "n_tokens": 12})[0] == 200
        status, page = http("GET", m.url + "/status")
        assert status == 200 and page["accepted"] == 1, page


def test_schedule_keeps_a_group_on_its_server_while_the_version_is_unchanged():
    with fake_servers(3) as servers, running_manager([s.url for s in servers], schedule_policy="round_robin") as m:
        body = {"qid": "g", "prompt_len": 10, "group_size": 4, "new_token_budget": 16}
        assert http("POST", f"{m.url}/allocate_rollout", {"qid": "g", "rank": 0})[1]["success"]
        _, first = http("POST", f"{m.url}/schedule_request", body)
        assert first["version"] == 0
        for _ in range(5):  # the other samples of the group, and later chunks
            _, again = http(
                "POST",
                f"{m.url}/schedule_request",
                {**body, "previous_server_url": first["url"], "previous_version": 0},
            )
            assert again["url"] == first["url"]
        set_version(1)
        wait_for(lambda: http("GET", f"{m.url}/status")[1]["version"] == 1, 5, "version 1")
        _, moved = http(
            "POST", f"{m.url}/schedule_request", {**body, "previous_server_url": first["url"], "previous_version": 0}
        )
        assert moved == {"url": moved["url"], "version": 1} and moved["url"] != first["url"]  # round robin: next


def test_scheduling_a_rollout_that_was_never_allocated_or_already_finished_is_refused():
    with fake_servers(1) as servers, running_manager([s.url for s in servers]) as m:
        body = {"qid": "ghost", "prompt_len": 10, "group_size": 1, "new_token_budget": 16}
        code, answer = http("POST", f"{m.url}/schedule_request", body)
        assert code == 409 and "call /allocate_rollout first" in answer["detail"]
        http("POST", f"{m.url}/allocate_rollout", {"qid": "ghost", "rank": 0})
        assert http("POST", f"{m.url}/schedule_request", body)[0] == 200
        http("POST", f"{m.url}/finish_rollout", {"qid": "ghost", "accepted": True})
        assert http("POST", f"{m.url}/schedule_request", body)[0] == 409
        assert all(x["requests"] == 0 for x in http("GET", f"{m.url}/status")[1]["servers"])


def test_least_requests_loads_do_not_drift_when_a_group_moves_servers():
    with (
        fake_servers(2) as servers,
        running_manager(
            [s.url for s in servers],
            schedule_policy="least_requests",
            max_concurrent_rollouts=100,
            max_head_offpolicyness=10,
        ) as m,
    ):
        a, b = (s.url for s in servers)  # the order the manager lists them in

        def schedule(qid, gs, prev=None, prev_v=None):
            return http(
                "POST",
                f"{m.url}/schedule_request",
                {
                    "qid": qid,
                    "prompt_len": 5,
                    "group_size": gs,
                    "new_token_budget": 10,
                    "previous_server_url": prev,
                    "previous_version": prev_v,
                },
            )[1]["url"]

        def loads():
            return {x["url"]: x["requests"] for x in http("GET", f"{m.url}/status")[1]["servers"]}

        for q in ("q1", "q2"):
            http("POST", f"{m.url}/allocate_rollout", {"qid": q, "rank": 0})
        assert schedule("q1", 1) == a and schedule("q2", 1) == b
        http("POST", f"{m.url}/finish_rollout", {"qid": "q1", "accepted": True})
        assert loads() == {a: 0, b: 1}
        set_version(1)
        wait_for(lambda: http("GET", f"{m.url}/status")[1]["version"] == 1, 5, "version 1")
        # q2 is resubmitted at the new version: its own load leaves b before choosing, so it goes
        # to a (tie, first listed) and is counted once, on a only.
        assert schedule("q2", 1, prev=b, prev_v=0) == a
        assert loads() == {a: 1, b: 0}
        # Many moves later, the loads are still the sum over live groups, and zero at the end.
        live = {}
        for i in range(30):
            q = f"m{i % 6}"
            if q not in live:
                http("POST", f"{m.url}/allocate_rollout", {"qid": q, "rank": 0})
            live[q] = (i % 3) + 1
            schedule(q, live[q], prev=a if i % 2 else b, prev_v=i % 2)
        assert sum(loads().values()) == sum(live.values()) + 1  # + q2
        for q in [*live, "q2"]:
            http("POST", f"{m.url}/finish_rollout", {"qid": q, "accepted": True})
        assert loads() == {a: 0, b: 0}


def test_weight_update_pauses_updates_and_continues_one_server_at_a_time_while_admission_answers(tmp_path):
    fileroot = str(tmp_path)
    os.makedirs(published_version_dir(fileroot, "actor", 1))
    with (
        fake_servers(2, check_model_path=True, update_delay=0.6) as servers,
        running_manager(
            [s.url for s in servers], run_dir=fileroot, max_concurrent_rollouts=1000, max_head_offpolicyness=100
        ) as m,
    ):
        set_version(1)
        # While the updates run (0.6 s per server), admission keeps answering, without waiting
        # for an update to end.
        latencies, answered_during_update = [], 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            before = [x["updating"] for x in http("GET", f"{m.url}/status")[1]["servers"]]
            t0 = time.monotonic()
            assert http("POST", f"{m.url}/allocate_rollout", {"qid": f"q{len(latencies)}", "rank": 0})[1]["success"]
            latencies.append(time.monotonic() - t0)
            _, status = http("GET", f"{m.url}/status")
            after = [x["updating"] for x in status["servers"]]
            answered_during_update += any(a and b for a, b in zip(before, after))
            if all(x["version"] == 1 for x in status["servers"]):
                break
            time.sleep(0.02)
        assert all(x["version"] == 1 for x in status["servers"]), status
        assert answered_during_update >= 3 and max(latencies) < 0.6, (answered_during_update, latencies)
        for s in servers:
            assert s.event_names() == ["pause", "update", "continue"]
            assert s.loaded_paths == [str(published_version_dir(fileroot, "actor", 1))] and s.weight_version == 1
        # One at a time: the second server is paused only after the first one continued.
        first, second = sorted(servers, key=lambda s: s.events[0][2])
        assert first.events[-1][2] <= second.events[0][2]


def test_a_failed_weight_update_still_continues_the_server_and_is_retried(tmp_path):
    fileroot = str(tmp_path)  # version 1's directory does not exist yet: the server refuses
    with fake_servers(1, check_model_path=True) as (server,), running_manager([server.url], run_dir=fileroot) as m:
        set_version(1)
        wait_for(lambda: http("GET", f"{m.url}/status")[1]["weight_updates"]["failed"] >= 1, 5, "a failed update")
        assert server.event_names()[:2] == ["pause", "continue"] and server.weight_version == 0
        os.makedirs(published_version_dir(fileroot, "actor", 1))
        wait_for(lambda: server.weight_version == 1, 10, "the retried update")
        assert "not a directory" in http("GET", f"{m.url}/status")[1]["weight_updates"]["last_error"]


def test_metrics_are_prometheus_text_with_the_numbers_of_status():
    from prometheus_client.parser import text_string_to_metric_families

    with fake_servers(1) as servers, running_manager([s.url for s in servers]) as m:
        http("POST", f"{m.url}/allocate_rollout", {"qid": "a", "rank": 0})
        status, text = http("GET", f"{m.url}/metrics")
        assert status == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        assert samples[("realhf_manager_running_rollouts", ())] == 1
        assert samples[("realhf_manager_server_version", (("url", servers[0].url),))] == 0
        assert samples[("realhf_manager_rejections_total", (("reason", "staleness"),))] == 0
        assert samples[("realhf_manager_accepted_rollouts_total", ())] == 0
        assert samples[("realhf_manager_rank_capacity", (("rank", "0"),))] == status_capacity(m)[0]


def test_manager_waits_for_its_servers_and_names_the_key_when_they_do_not_come():
    from realhf.system.manager.gserver_manager import wait_for_servers

    key = names.gen_servers("rollout-test", "t0")
    name_resolve.add_subentry(key, "http://127.0.0.1:1")
    assert wait_for_servers("rollout-test", "t0", 1, timeout=1) == ["http://127.0.0.1:1"]
    with pytest.raises(TimeoutError, match=f"1 of 2 generation servers registered under '{key}'"):
        wait_for_servers("rollout-test", "t0", 2, timeout=0.3)


def test_manager_config_rejects_bad_values_naming_the_field():
    from realhf.api.worker_configs import GserverManagerConfig, RolloutWorkerConfig
    from realhf.experiments.validation import ConfigError
    from realhf.experiments.worker_validation import validate_worker_config

    with pytest.raises(ConfigError, match="gserver_manager.schedule_policy='fastest'.*least_token_usage"):
        validate_worker_config(GserverManagerConfig(schedule_policy="fastest"))
    with pytest.raises(ConfigError, match="gserver_manager.poll_interval"):
        validate_worker_config(GserverManagerConfig(poll_interval=2.0))
    with pytest.raises(ConfigError, match="gserver_manager.max_head_offpolicyness"):
        validate_worker_config(GserverManagerConfig(max_head_offpolicyness=-1))
    with pytest.raises(ConfigError, match="rollout_worker.group_size"):
        validate_worker_config(RolloutWorkerConfig(group_size=0))
    validate_worker_config(GserverManagerConfig())  # the defaults pass


def test_a_server_that_keeps_refusing_weights_is_retried_with_doubling_delays_up_to_30_s():
    from realhf.system.manager.weight_update import MAX_RETRY_DELAY_S, WeightUpdater

    up = WeightUpdater("/nonexistent", "actor", timeout=1.0)
    up.set_servers(["http://s"])
    delays = []
    for _ in range(7):
        t0 = time.monotonic()
        up._failed("http://s", 3, RuntimeError("refused"))
        delays.append(round(up.retry_at["http://s"] - t0))
    assert delays == [1, 2, 4, 8, 16, 30, 30] and MAX_RETRY_DELAY_S == 30
    assert up.n_failures == 7 and "refused" in up.last_error


def test_a_failing_server_waits_alone_while_the_others_are_updated_at_once():
    """A dead server still registered (until its key's TTL ends) used to hold every server at
    old weights for up to 30 s; their groups then arrived too stale to train."""
    from realhf.system.manager.weight_update import WeightUpdater

    up = WeightUpdater("/nonexistent", "actor", timeout=1.0)
    up.set_servers(["http://dead", "http://live"])
    up._failed("http://dead", 3, RuntimeError("cannot connect"))
    up.versions["http://live"] = 3
    assert not up.due(3)  # only the dead one is behind, and it waits
    assert up.due(4)  # the live one falls behind: it is updated now
    assert not up._ready("http://dead") and up._ready("http://live")


def test_a_body_over_max_request_bytes_gets_413_and_admission_keeps_answering():
    with fake_servers(1) as servers, running_manager([s.url for s in servers], max_request_bytes=4096) as m:
        status, answer = http("POST", m.url + "/abandon_rollouts", {"qids": ["q" * 100] * 100})  # ~10 KB
        assert status == 413 and "max_request_bytes=4096" in str(answer), (status, answer)
        status, answer = http("POST", m.url + "/allocate_rollout", {"qid": "q", "rank": 0})
        assert status == 200 and answer["success"]
