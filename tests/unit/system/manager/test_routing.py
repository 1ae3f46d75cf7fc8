"""Specification of generation-request routing (docs/architecture.md §5), realhf.system.manager.routing."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from realhf.system.manager.routing import POLICIES, Router, ServerLoad

A, B, C = "http://a:1", "http://b:2", "http://c:3"


def schedule(router, qid, prompt_len=10, group_size=1, budget=20, **kw):
    return router.schedule(qid, prompt_len, group_size, budget, **kw)


# ---------------------------------------------------------------------------------------------
# Loads
# ---------------------------------------------------------------------------------------------


def test_load_of_a_group_is_group_size_requests_and_group_size_times_prompt_plus_budget_tokens():
    # group_size 4, prompt 10, budget 20 → 4 requests, 4·(10 + 20) = 120 tokens.
    router = Router("least_requests", [A, B])
    url = schedule(router, "q", prompt_len=10, group_size=4, budget=20)
    assert router.loads()[url] == ServerLoad(requests=4, tokens=120)


def test_rescheduling_a_qid_replaces_its_load_instead_of_adding_to_it():
    router = Router("least_requests", [A, B])
    assert schedule(router, "q", prompt_len=10, budget=20) == A
    # Same version: stays on A, with its new (longer) prompt — counted once.
    assert schedule(router, "q", prompt_len=25, budget=5, previous_url=A, previous_version=0, current_version=0) == A
    assert router.loads() == {A: ServerLoad(1, 30), B: ServerLoad(0, 0)}


def test_rescheduling_onto_another_server_moves_the_load():
    router = Router("round_robin", [A, B])
    assert schedule(router, "q") == A
    assert schedule(router, "q", previous_url=A, previous_version=0, current_version=1) == B
    assert router.loads() == {A: ServerLoad(0, 0), B: ServerLoad(1, 30)}
    assert router.server_of("q") == B


def test_release_removes_the_load_and_is_idempotent():
    router = Router("least_requests", [A])
    schedule(router, "q")
    router.release("q")
    router.release("q")
    router.release("never-scheduled")
    assert router.loads() == {A: ServerLoad(0, 0)}
    assert router.server_of("q") is None


# ---------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------


def test_unknown_policy_is_rejected_with_the_valid_ones_listed():
    with pytest.raises(ValueError, match="round_robin, least_requests, least_token_usage"):
        Router("random", [A])


def test_round_robin_cycles_through_servers_in_order():
    router = Router("round_robin", [A, B, C])
    assert [schedule(router, q) for q in range(7)] == [A, B, C, A, B, C, A]


def test_least_requests_spreads_equal_groups_evenly():
    router = Router("least_requests", [A, B, C])
    for q in range(30):
        schedule(router, q, group_size=2)
    assert {url: load.requests for url, load in router.loads().items()} == {A: 20, B: 20, C: 20}


def test_least_requests_stays_balanced_while_groups_come_and_go():
    # 12 groups of 4 in flight; each new group arrives, then the oldest finishes. A finish can
    # leave one server a group short, and the next group fills exactly that gap, so right after
    # every schedule the servers are at most one group (4 requests) apart.
    router = Router("least_requests", [A, B, C])
    for q in range(300):
        schedule(router, q, group_size=4)
        counts = [load.requests for load in router.loads().values()]
        assert max(counts) - min(counts) <= 4
        if q >= 12:
            router.release(q - 12)


def test_least_requests_counts_one_request_per_sample():
    # A group of 8 on A outweighs groups of 1 on B and C.
    router = Router("least_requests", [A, B, C])
    assert schedule(router, "big", group_size=8) == A
    assert [schedule(router, q, group_size=1) for q in range(4)] == [B, C, B, C]


def test_least_token_usage_prefers_the_server_with_fewer_reserved_tokens():
    router = Router("least_token_usage", [A, B])
    assert schedule(router, "long", prompt_len=1000, budget=100) == A
    # B has fewer tokens until its short groups add up to A's 1100.
    assert [schedule(router, q, prompt_len=100, budget=100) for q in range(6)] == [B, B, B, B, B, B]
    assert schedule(router, "next", prompt_len=100, budget=100) == A  # B now holds 1200 > 1100


def test_ties_go_to_the_server_listed_first():
    router = Router("least_token_usage", [C, A, B])
    assert schedule(router, "q") == C


# ---------------------------------------------------------------------------------------------
# Affinity
# ---------------------------------------------------------------------------------------------


def test_same_version_keeps_the_previous_server_even_if_it_is_busier():
    router = Router("least_requests", [A, B])
    schedule(router, "busy", group_size=16)  # on A
    assert schedule(router, "q", previous_url=A, previous_version=3, current_version=3) == A


def test_changed_version_ignores_the_previous_server():
    router = Router("least_requests", [A, B])
    schedule(router, "busy", group_size=16)  # on A
    assert schedule(router, "q", previous_url=A, previous_version=3, current_version=4) == B


def test_a_removed_previous_server_is_not_reused():
    router = Router("least_requests", [A, B])
    router.set_servers([B, C])
    assert schedule(router, "q", previous_url=A, previous_version=1, current_version=1) == B


# ---------------------------------------------------------------------------------------------
# Server set changes
# ---------------------------------------------------------------------------------------------


def test_removed_servers_take_their_loads_with_them_and_their_qids_move_on_next_schedule():
    router = Router("round_robin", [A, B])
    assert schedule(router, "on-a") == A
    assert schedule(router, "on-b") == B
    router.set_servers([B, C])
    assert router.loads() == {B: ServerLoad(1, 30), C: ServerLoad(0, 0)}
    assert router.server_of("on-a") is None
    router.release("on-a")  # harmless
    moved = schedule(router, "on-a", previous_url=A, previous_version=0, current_version=0)
    assert moved in (B, C) and router.server_of("on-a") == moved


def test_a_server_that_comes_back_starts_empty():
    router = Router("least_requests", [A, B])
    schedule(router, "q")  # on A
    router.set_servers([B])
    router.set_servers([A, B])
    assert router.loads() == {A: ServerLoad(0, 0), B: ServerLoad(0, 0)}


def test_scheduling_without_servers_is_an_error():
    router = Router("round_robin", [])
    with pytest.raises(RuntimeError, match="no generation servers"):
        schedule(router, "q")


def test_duplicate_server_urls_are_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Router("round_robin", [A, A])


# ---------------------------------------------------------------------------------------------
# No drift: random operation sequences against a plain model
# ---------------------------------------------------------------------------------------------

POOL = [A, B, C, "http://d:4"]


class RouterAgainstModel(RuleBasedStateMachine):
    """The model keeps qid → (url, requests, tokens); per-server loads must always equal the sums
    over it, and every choice must follow the affinity rule and the policy."""

    @initialize(policy=st.sampled_from(POLICIES), n_servers=st.integers(1, 4))
    def start(self, policy, n_servers):
        self.router = Router(policy, POOL[:n_servers])
        self.servers = POOL[:n_servers]
        self.model = {}
        self.policy = policy

    def model_loads(self, exclude=None):
        loads = {url: [0, 0] for url in self.servers}
        for qid, (url, requests, tokens) in self.model.items():
            if qid != exclude:
                loads[url][0] += requests
                loads[url][1] += tokens
        return loads

    @rule(
        qid=st.integers(0, 9),
        prompt_len=st.integers(0, 50),
        group_size=st.integers(1, 8),
        budget=st.integers(0, 50),
        previous_url=st.one_of(st.none(), st.sampled_from(POOL)),
        same_version=st.booleans(),
    )
    def schedule(self, qid, prompt_len, group_size, budget, previous_url, same_version):
        if not self.servers:
            with pytest.raises(RuntimeError):
                self.router.schedule(qid, prompt_len, group_size, budget)
            return
        others = self.model_loads(exclude=qid)
        url = self.router.schedule(
            qid,
            prompt_len,
            group_size,
            budget,
            previous_url=previous_url,
            previous_version=5,
            current_version=5 if same_version else 6,
        )
        assert url in self.servers
        if previous_url in self.servers and same_version:
            assert url == previous_url
        elif self.policy == "least_requests":
            assert others[url][0] == min(load[0] for load in others.values())
        elif self.policy == "least_token_usage":
            assert others[url][1] == min(load[1] for load in others.values())
        self.model[qid] = (url, group_size, group_size * (prompt_len + budget))

    @rule(qid=st.integers(0, 9))
    def release(self, qid):
        self.router.release(qid)
        self.model.pop(qid, None)

    @rule(servers=st.lists(st.sampled_from(POOL), unique=True, max_size=4))
    def set_servers(self, servers):
        self.router.set_servers(servers)
        self.servers = servers
        self.model = {q: entry for q, entry in self.model.items() if entry[0] in servers}

    @invariant()
    def loads_equal_the_sum_of_recorded_qid_loads(self):
        expected = {url: ServerLoad(*load) for url, load in self.model_loads().items()}
        assert self.router.loads() == expected
        for qid in range(10):
            assert self.router.server_of(qid) == (self.model[qid][0] if qid in self.model else None)


RouterAgainstModel.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_router_loads_never_drift = RouterAgainstModel.TestCase
