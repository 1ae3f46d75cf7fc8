"""A tiny client of the SGLang HTTP protocol (docs/architecture.md §5): /generate and the running-requests gauge."""

from prometheus_client.parser import text_string_to_metric_families

from helpers.http import http
from helpers.wait import wait_for


def generate(url, input_ids, timeout=60.0, rid=None, headers=None, **sampling):
    """`headers`: e.g. `realhf.base.secret.auth_headers(secret)` for a server of a launched run."""
    body = {"input_ids": list(input_ids), "sampling_params": sampling, "return_logprob": True}
    if rid:
        body["rid"] = rid
    status, out = http("POST", f"{url}/generate", body, timeout, headers=headers)
    assert status == 200, f"/generate failed with {status}: {out}"
    return out


def running_requests(url) -> float:
    """SGLang's `sglang:num_running_reqs` gauge (0 when /metrics does not answer)."""
    status, text = http("GET", f"{url}/metrics")
    running = 0
    if status == 200:
        for fam in text_string_to_metric_families(text):
            if fam.name == "sglang:num_running_reqs":
                running = sum(s.value for s in fam.samples)
    return running


def wait_running(url, n, timeout=30.0):
    """Until the server reports >= n running requests."""
    wait_for(lambda: running_requests(url) >= n, timeout, f"{n} running requests at {url}")
