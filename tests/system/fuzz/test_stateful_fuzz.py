"""Issue 14, item 1: both HTTP APIs fuzzed statefully, against a model of what they must do.

A hypothesis `RuleBasedStateMachine` drives a real GserverManager (HTTP app + watcher on
127.0.0.1, fresh for every example) that routes to a real native generation server (tiny model,
one for the module): allocate → schedule → generate on the scheduled server → finish / abandon,
with qids valid and hostile (empty, at and beyond the length bound, 200 000 characters, NUL and
non-BMP characters, not strings, duplicates, finished twice, scheduled without being allocated)
and numbers at the edges (0, 1, 2**31-1, 2**31, 2**63, -1, 1.5, 1e308, NaN, Infinity), and the
server's /generate with extreme sampling values. The model predicts every status code exactly
(200, 409, 404, 422; 400 from the server; never a 5xx) and, after every step, the manager's
whole /status: running, accepted, finished, filtered, tokens, abandoned, rejections by reason,
capacity by the admission rule, and the load routed to the server. After every step the server
must still serve: /health 200 and a tiny greedy /generate answers tokens.

Derandomized and bounded (MAX_EXAMPLES × STEPS) so CI sees the same ~30 s run every time.
"""

import json
import math
import os

import pytest
import requests
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from helpers.manager_harness import EXP, TRIAL, manager_config
from helpers.native_server import SMALL_CONTEXT

# REALHF_FUZZ_EXAMPLES=500 (and derandomize off via REALHF_FUZZ_RANDOM=1) for a longer hunt.
MAX_EXAMPLES, STEPS = int(os.environ.get("REALHF_FUZZ_EXAMPLES", 30)), 30
MAX_CONCURRENT, GROUPS_PER_STEP, ETA = 6, 4, 2  # staleness room (ETA+1)·B = 12 accepted at version 0
_MAX_COUNT, _MAX_QID, _MAX_URL = 2**31 - 1, 1024, 4096
VOCAB = 256  # the tiny model's

NUMBERS = [0, 1, 2, 7, 2**31 - 1, 2**31, 2**63, -1, -(2**63), 1.5, 1e308, -1e308, math.nan, math.inf, -math.inf]
HOSTILE_QIDS = [
    "",
    "q" * _MAX_QID,
    "q" * (_MAX_QID + 1),
    "x" * 200_000,
    "nul\u0000qid",
    "\U0001f600" * 10,
    None,
    123,
    ["q0"],
    {"q": 1},
    True,
]
URLS = [None, "http://127.0.0.1:9", "not a url", "u" * _MAX_URL, "u" * (_MAX_URL + 1), 5]
SAMPLING_VALUES = {
    "max_new_tokens": [0, 1, 3, SMALL_CONTEXT, 2**31 - 1, 2**31, 2**63, -1, 1e308, math.nan],
    "min_new_tokens": [0, 1, 5, 2**31, -1, 2**63],
    "temperature": [0.0, 1e-300, 1e-45, 0.5, 1.0, 1e30, 1e308, -1.0, math.inf, math.nan, 5e-324],
    "top_p": [0.0, 5e-324, 1e-300, 0.5, 1.0, 1.0000001, -0.5, math.nan, math.inf],
    "top_k": [-1, 0, 1, 2, VOCAB, VOCAB + 1, 2**31 - 1, 2**31, 2**63, -2, -(2**63)],
    "stop_token_ids": [[], [0], [VOCAB - 1], [VOCAB], [-1], [2**63], list(range(VOCAB))],
}
INPUT_IDS = [
    [5, 6, 7],
    [0],
    [VOCAB - 1] * 8,
    [],
    [-1],
    [VOCAB],
    [2**63],
    list(range(SMALL_CONTEXT)),
    [1] * (SMALL_CONTEXT + 1),
]


def as_int(v, lo, hi):
    """The int pydantic (lax) would make of JSON value `v` if it lies in [lo, hi], else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float):
        if not math.isfinite(v) or not v.is_integer():
            return None
        v = int(v)
    if isinstance(v, int) and lo <= v <= hi:
        return v
    return None


def valid_qid(q):
    return isinstance(q, str) and 1 <= len(q) <= _MAX_QID


class ManagerAndServer(RuleBasedStateMachine):
    native_url: str = ""
    session: requests.Session = None

    def __init__(self):
        super().__init__()
        from realhf.system.manager.gserver_manager import serve_manager

        config = manager_config(
            max_concurrent_rollouts=MAX_CONCURRENT,
            groups_per_step=GROUPS_PER_STEP,
            max_head_offpolicyness=ETA,
            poll_interval=0.05,
            n_servers=1,
            schedule_policy="least_token_usage",
        )
        from realhf.base import name_resolve, names

        name_resolve.clear_subtree(names.admission_ledger(EXP, TRIAL))  # each example is a new run
        self.manager = serve_manager(config, EXP, TRIAL, server_urls=[self.native_url])
        self.base = self.manager.url
        self.n_new = 0
        self.running = set()  # allocated, not finished nor abandoned
        self.ended = []  # finished or abandoned
        self.load = {}  # qid -> (requests, tokens) routed, while running
        self.accepted = self.finished = self.filtered = self.total_tokens = self.abandoned = 0
        self.rejections = {"max_concurrent_rollouts": 0, "staleness": 0, "duplicate_qid": 0}

    def teardown(self):
        self.manager.stop()

    # ---- helpers ------------------------------------------------------------------------------
    def post(self, url, body):
        r = self.session.post(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, timeout=60
        )
        assert r.status_code < 500, f"POST {url} {json.dumps(body)[:300]} -> {r.status_code} {r.text[:300]}"
        return r

    def pick_qid(self, data):
        kinds = ["new", "hostile", "ended_or_unknown"] + ["running"] * 3 * bool(self.running)
        kind = data.draw(st.sampled_from(kinds))
        if kind == "running":
            return data.draw(st.sampled_from(sorted(self.running)))
        if kind == "new":
            self.n_new += 1
            return f"q{self.n_new}"
        if kind == "ended_or_unknown":
            return data.draw(st.sampled_from(self.ended + ["unknown-qid"]))
        return data.draw(st.sampled_from(HOSTILE_QIDS))

    def expected_capacity(self):
        room = (ETA + 0 + 1) * GROUPS_PER_STEP - (self.accepted + len(self.running))
        return min(MAX_CONCURRENT - len(self.running), max(0, room))

    def release(self, qid):
        self.running.discard(qid)
        self.load.pop(qid, None)
        self.ended.append(qid)

    # ---- the manager's endpoints ---------------------------------------------------------------
    @rule(data=st.data(), rank=st.sampled_from(NUMBERS + ["0", None]))
    def allocate(self, data, rank):
        qid = self.pick_qid(data)
        r = self.post(f"{self.base}/allocate_rollout", {"qid": qid, "rank": rank})
        # "0" is coerced by pydantic's lax mode; any rank but 0 is outside the 1 trainer rank.
        if not valid_qid(qid) or (rank != "0" and as_int(rank, 0, 0) is None):
            assert r.status_code == 422, (qid, rank, r.status_code, r.text[:200])
            return
        assert r.status_code == 200, r.text[:300]
        if qid in self.running:
            reason = "duplicate_qid"
        elif len(self.running) >= MAX_CONCURRENT:
            reason = "max_concurrent_rollouts"
        elif self.expected_capacity() <= 0:
            reason = "staleness"
        else:
            reason = "ok"
        assert r.json() == {"success": reason == "ok", "reason": reason}, (qid, r.json())
        if reason == "ok":
            self.running.add(qid)
        else:
            self.rejections[reason] += 1

    @rule(
        data=st.data(),
        prompt_len=st.sampled_from(NUMBERS),
        group_size=st.sampled_from(NUMBERS),
        budget=st.sampled_from(NUMBERS),
        previous_url=st.sampled_from(URLS + ["<server>"]),
        previous_version=st.sampled_from([None] + NUMBERS),
    )
    def schedule(self, data, prompt_len, group_size, budget, previous_url, previous_version):
        qid = self.pick_qid(data)
        previous_url = self.native_url if previous_url == "<server>" else previous_url
        body = {
            "qid": qid,
            "prompt_len": prompt_len,
            "group_size": group_size,
            "new_token_budget": budget,
            "previous_server_url": previous_url,
            "previous_version": previous_version,
        }
        r = self.post(f"{self.base}/schedule_request", body)
        pl, gs, nb = as_int(prompt_len, 0, _MAX_COUNT), as_int(group_size, 1, _MAX_COUNT), as_int(budget, 0, _MAX_COUNT)
        url_ok = previous_url is None or (isinstance(previous_url, str) and len(previous_url) <= _MAX_URL)
        version_ok = previous_version is None or as_int(previous_version, 0, _MAX_COUNT) is not None
        if not valid_qid(qid) or None in (pl, gs, nb) or not url_ok or not version_ok:
            assert r.status_code == 422, (body, r.status_code, r.text[:200])
            return
        if qid not in self.running:
            assert r.status_code == 409, (qid, r.status_code, r.text[:200])
            return
        assert r.status_code == 200, r.text[:300]
        assert r.json() == {"url": self.native_url, "version": 0}
        self.load[qid] = (gs, gs * (pl + nb))

    @rule(
        data=st.data(),
        accepted=st.sampled_from([True, False, "maybe", None, 2]),
        n_tokens=st.sampled_from(NUMBERS + [_MAX_COUNT - 1]),
    )
    def finish(self, data, accepted, n_tokens):
        qid = self.pick_qid(data)
        r = self.post(f"{self.base}/finish_rollout", {"qid": qid, "accepted": accepted, "n_tokens": n_tokens})
        nt = as_int(n_tokens, 0, _MAX_COUNT)
        if not valid_qid(qid) or not isinstance(accepted, bool) or nt is None:
            assert r.status_code == 422, (qid, accepted, n_tokens, r.status_code, r.text[:200])
            return
        if qid not in self.running:
            assert r.status_code == 404, (qid, r.status_code, r.text[:200])
            return
        assert r.status_code == 200 and r.json() == {"success": True}, r.text[:300]
        self.release(qid)
        self.finished += 1
        self.accepted += accepted
        self.filtered += not accepted
        self.total_tokens += nt

    @rule(data=st.data())
    def abandon(self, data):
        qids = [self.pick_qid(data) for _ in range(data.draw(st.integers(0, 4)))]
        r = self.post(f"{self.base}/abandon_rollouts", {"qids": qids})
        if not all(isinstance(q, str) for q in qids):
            assert r.status_code == 422, (qids, r.status_code)
            return
        hit = [q for q in dict.fromkeys(qids) if q in self.running]
        assert r.status_code == 200 and r.json() == {"abandoned": len(hit), "unknown": len(set(qids)) - len(hit)}, (
            r.text
        )
        for q in hit:
            self.release(q)
        self.abandoned += len(hit)

    # ---- the generation server ---------------------------------------------------------------
    @rule(
        data=st.data(),
        input_ids=st.sampled_from(INPUT_IDS),
        extreme=st.sampled_from(sorted(SAMPLING_VALUES)),
        n_extreme=st.integers(1, 3),
    )
    def generate(self, data, input_ids, extreme, n_extreme):
        """/generate on the server the manager routed a running qid to (the only one), with one
        to three sampling values at their extremes."""
        params = {"max_new_tokens": 3, "temperature": 1.0}
        for name in data.draw(
            st.lists(st.sampled_from(sorted(SAMPLING_VALUES)), min_size=n_extreme - 1, max_size=n_extreme - 1)
        ) + [extreme]:
            params[name] = data.draw(st.sampled_from(SAMPLING_VALUES[name]))
        r = self.post(
            f"{self.native_url}/generate", {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
        )
        assert r.status_code in (200, 400), (params, r.status_code, r.text[:300])
        if r.status_code == 200:
            out = r.json()
            assert isinstance(out["output_ids"], list) and all(0 <= t < VOCAB for t in out["output_ids"])
            assert len(out["output_ids"]) <= max(params["max_new_tokens"], 0)
            lps = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
            assert all(isinstance(x, float) and x <= 0 and math.isfinite(x) for x in lps), lps[:5]

    # ---- after every step ---------------------------------------------------------------------
    @invariant()
    def manager_status_agrees_with_the_model(self):
        r = self.session.get(f"{self.base}/status", timeout=30)
        assert r.status_code == 200, r.text[:300]
        s = r.json()
        assert s["running"] == len(self.running) == s["per_rank"]["running"][0]
        assert s["accepted"] == self.accepted and s["rejections"] == self.rejections
        assert s["abandoned"] == self.abandoned
        t = s["throughput"]
        assert (t["finished"], t["filtered"], t["total_tokens"]) == (self.finished, self.filtered, self.total_tokens)
        assert s["capacity"] == self.expected_capacity() >= 0, (s["capacity"], self.expected_capacity())
        [server] = s["servers"]
        expected_load = [sum(x) for x in zip(*self.load.values())] or [0, 0]
        assert [server["requests"], server["tokens"]] == expected_load

    @invariant()
    def server_still_serves(self):
        assert self.session.get(f"{self.native_url}/health", timeout=30).status_code == 200
        r = self.session.post(
            f"{self.native_url}/generate",
            json={"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2, "temperature": 0}},
            timeout=30,
        )
        assert r.status_code == 200 and len(r.json()["output_ids"]) >= 1, r.text[:300]


@pytest.fixture
def machine(nr, native_server):
    url, _ = native_server
    with requests.Session() as session:
        ManagerAndServer.native_url, ManagerAndServer.session = url, session
        yield ManagerAndServer


def test_stateful_fuzz_of_manager_and_server(machine):
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STEPS,
            derandomize=not os.environ.get("REALHF_FUZZ_RANDOM"),
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
