"""The manager's admission ledger (realhf/system/manager/admission_ledger.py) in a real redis-server: each
admission event is one transaction; a manager built on a predecessor's record continues exactly
(same running rollouts, same capacity); the accounting flags a group that never arrived."""

import threading

import pytest

from helpers.manager_harness import EXP, TRIAL, manager_config
from realhf.base import name_resolve, names
from realhf.system.manager.admission_ledger import AdmissionLedger, accounting, parse
from realhf.system.manager.manager_service import ManagerService

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("nr")]
KEY = names.admission_ledger(EXP, TRIAL)


def _service(**fields):
    config = manager_config(
        **{"groups_per_step": 2, "max_concurrent_rollouts": 6, "max_head_offpolicyness": 1, "n_servers": 1, **fields}
    )
    return ManagerService(config, ["http://127.0.0.1:9"], AdmissionLedger(KEY, config.n_trainer_ranks))


def test_records_are_changed_atomically_and_field_by_field_in_redis():
    name_resolve.update_record(KEY, put={"a": 1, "b": "x"}, incr={"n": 2})
    name_resolve.update_record(KEY, remove=["a"], incr={"n": 3})
    assert name_resolve.get_record(KEY) == {"b": "x", "n": "5"}
    # Concurrent increments from many threads lose nothing (HINCRBY in MULTI/EXEC).
    threads = [
        threading.Thread(target=lambda: [name_resolve.update_record(KEY, incr={"n": 1}) for _ in range(50)])
        for _ in range(4)
    ]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert name_resolve.get_record(KEY)["n"] == "205"
    name_resolve.clear_subtree(names.trial_root(EXP, TRIAL))  # a record goes with the trial's keys
    assert name_resolve.get_record(KEY) == {}


def test_a_restarted_manager_continues_with_the_same_running_rollouts_counts_and_capacity():
    first = _service()
    assert [first.allocate(q, 0)["success"] for q in "abcd"] == [True] * 4
    first.finish("a", True, 10)
    first.finish("b", False, 0, "timed_out")
    first.abandon(["c"])
    before = first.status()
    second = _service()  # the same run's next manager (the launcher restarted it)
    after = second.status()
    for key in ("running", "accepted", "capacity", "abandoned", "ended"):
        assert after[key] == before[key], key
    assert after["manager_starts"] == 2 and before["manager_starts"] == 1
    # "d" was admitted by the first: the second schedules and finishes it.
    assert second.schedule("d", 3, 1, 8)["url"] == "http://127.0.0.1:9"
    second.finish("d", True, 5)
    state = AdmissionLedger(KEY, 1).load()
    assert state.balanced and state.admitted == 4 and state.accepted == [2] and state.ended == {"timed_out": 1}
    assert state.running == {} and state.abandoned == 1


def test_an_admission_that_cannot_be_recorded_is_not_made():
    service = _service()
    # The key now holds a plain value: Redis refuses every write to it (WRONGTYPE), as a lost one would.
    name_resolve.add(KEY, "not a record", replace=True)
    with pytest.raises(Exception, match="WRONGTYPE"):
        service.allocate("q", 0)
    assert service.status()["running"] == 0


def test_an_unknown_end_reason_is_refused_naming_the_reasons():
    service = _service()
    service.allocate("q", 0)
    with pytest.raises(ValueError, match="reason 'bored' is not one of"):
        service.finish("q", False, 0, "bored")
    assert service.status()["running"] == 1


def test_a_record_of_another_dp_size_or_garbage_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"field 'accepted/3'='1' does not parse for a trainer of 2 DP ranks"):
        parse({"accepted/3": "1"}, 2)
    with pytest.raises(ValueError, match="'starts'='x'"):
        parse({"starts": "x"}, 1)
    with pytest.raises(ValueError, match=r"DP rank outside \[0, 1\)"):
        parse({"run/q": "1"}, 1)


def _heads(added, taken, stale, buffered, invalid=0):
    return [
        {
            "added": added,
            "taken": taken,
            "stale_dropped": stale,
            "buffered": buffered,
            "invalid": invalid,
            "duplicates": 0,
        }
    ]


def test_accounting_holds_only_when_every_accepted_group_arrived_and_the_trainer_balances():
    state = parse({"admitted": "10", "accepted/0": "8", "ended/filtered": "1", "run/q": "0", "starts": "1"}, 1)
    ok = accounting(state, _heads(added=9, taken=6, stale=1, buffered=2), [0])
    assert ok["holds"] and ok["lost"] == 0 and ok["arrived"] == 9
    lost = accounting(state, _heads(added=7, taken=6, stale=0, buffered=1), [0])
    assert not lost["holds"] and lost["lost"] == 1
    unbalanced = accounting(state, _heads(added=9, taken=6, stale=0, buffered=2), [0])
    assert not unbalanced["holds"]
    miscounted = parse({"admitted": "11", "accepted/0": "8", "ended/filtered": "1", "run/q": "0"}, 1)
    assert not accounting(miscounted, _heads(added=9, taken=6, stale=1, buffered=2), [0])["holds"]
    # A resumed run's manager starts from the trained groups; they are not this run's admissions.
    resumed = parse({"admitted": "18", "accepted/0": "16", "ended/filtered": "1", "run/q": "0"}, 1)
    assert accounting(resumed, _heads(added=9, taken=6, stale=1, buffered=2), [8])["admissions"] == 10
