"""The conformance suite against one running server: the fixtures' examples sent as written, and
realhf's own weight-update clients driven through a recording proxy, every request and answer
checked against SGLang's shapes (fixtures.py).

    outcomes = run_suite("http://127.0.0.1:30000")                        # read-only examples
    outcomes = run_suite(url, control=True, weights=True, model_path=p)   # + pause, weight updates

In order (the later groups only when asked; each changes the server):
    read      /health, /get_model_info, /generate (one prompt, n samples, a batch, text, the token
              budget, an unknown sampling parameter), /abort_request, /flush_cache, and
              /destroy_weights_update_group of a group never joined
    control   /pause_generation then /continue_generation (aborts the running requests)
    weights   /update_weights_from_disk as written; then realhf's manager update of one server
              (pause -> update_weights_from_disk -> continue) and the trainer's broadcast of the
              weights in `model_path` (init group -> pause -> update_weights_from_distributed per
              bucket -> continue -> destroy), each through the proxy; /get_model_info must then
              report the version set. The weights sent are the ones in `model_path`, so a server
              started from it serves the same model afterwards, under a higher version.

`strict`: an answer may hold no key beyond SGLang's and realhf's declared own (for the built-in
server; a real SGLang server may add keys of its own, so it is checked without).
"""

from __future__ import annotations

import asyncio
import copy
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import realhf.testing.sglang_conformance.fixtures as fixtures
from realhf.impl.inference.request import parse_weight_version
from realhf.testing.sglang_conformance.schema import mismatches

GROUPS = ("read", "control", "weights")


@dataclass
class Outcome:
    """What the suite found for one endpoint."""

    endpoint: str
    methods: List[str]
    checks: int = 0  # requests and answers checked
    problems: List[str] = field(default_factory=list)
    skipped: str = ""  # why it was not exercised

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        verb = "/".join(self.methods)
        if self.skipped and not self.checks:
            return f"SKIP  {verb} {self.endpoint}  ({self.skipped})"
        if self.ok:
            return f"PASS  {verb} {self.endpoint}  ({self.checks} check{'' if self.checks == 1 else 's'})"
        more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
        return f"FAIL  {verb} {self.endpoint}  {self.problems[0]}{more}"


class _Report:
    def __init__(self):
        self.outcomes = {e: Outcome(e, list(spec["methods"])) for e, spec in fixtures.ENDPOINTS.items()}

    def check(self, endpoint: str, problems: List[str]) -> None:
        self.outcomes.setdefault(endpoint, Outcome(endpoint, ["?"]))
        self.outcomes[endpoint].checks += 1
        self.outcomes[endpoint].problems += problems

    def skip(self, endpoint: str, why: str) -> None:
        if not self.outcomes[endpoint].skipped:
            self.outcomes[endpoint].skipped = why


def _call(url: str, method: str, body: Any, timeout: float, headers: Dict[str, str]) -> Tuple[int, str, str]:
    """(status, content type, body text) of one HTTP call; a failed connection raises, naming it."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers.get("Content-Type", "").split(";")[0], r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", "").split(";")[0], e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        raise ConnectionError(f"{method} {url}: no answer within {timeout:.0f}s or refused ({e})") from None


def check_answer(
    status: int, ctype: str, text: str, want_status: int, answer: Dict[str, Any], strict: bool, where: str
) -> List[str]:
    """How one answer differs from the fixture's (`answer`: {content, shape?})."""
    if status != want_status:
        return [f"{where}: HTTP {status}, expected {want_status}: {text[:200]!r}"]
    content = answer["content"]
    if content == "sse":
        return _stream_problems(ctype, text, answer["partial"], answer["shape"], strict, where)
    if content == "empty":
        return [] if text == "" else [f"{where}: expected an empty body, got {text[:100]!r}"]
    try:
        value = json.loads(text) if text.strip() else None
    except ValueError:
        value = None
        if content == "json":
            return [f"{where}: expected JSON, got {ctype or 'no content type'} {text[:100]!r}"]
    if content == "text":
        return [] if value is None and text else [f"{where}: expected plain text, got {text[:100]!r}"]
    return mismatches(value, answer["shape"], f"{where}: body", strict)


def _stream_problems(
    ctype: str, text: str, partial: Dict[str, Any], shape: Dict[str, Any], strict: bool, where: str
) -> List[str]:
    """How a streamed /generate answer differs from SGLang's default streaming: `data: {json}`
    events, each the output so far (longer than the one before: the last token comes with the
    finish reason, never as a repeat), finish_reason null until the last, then `data: [DONE]`."""
    if ctype != "text/event-stream":
        return [f"{where}: expected text/event-stream, got {ctype or 'no content type'} {text[:100]!r}"]
    blocks = [b for b in text.split("\n\n") if b.strip()]
    if not blocks or blocks[-1].strip() != "data: [DONE]":
        return [f"{where}: the stream does not end with 'data: [DONE]': {text[-200:]!r}"]
    problems, events, n = [], [], len(blocks) - 1
    for i, block in enumerate(blocks[:-1]):
        if not block.startswith("data: "):
            return [f"{where}: event {i} is not a 'data: ' line: {block[:100]!r}"]
        try:
            events.append(json.loads(block[len("data: ") :]))
        except ValueError:
            return [f"{where}: event {i} is not JSON: {block[:100]!r}"]
        problems += mismatches(events[-1], shape if i == n - 1 else partial, f"{where}: event {i}", strict)
    if not events:
        return problems + [f"{where}: no event before [DONE]"]
    for i, e in enumerate(events):
        done = (e.get("meta_info") or {}).get("finish_reason") is not None
        if done != (i == len(events) - 1):
            problems.append(f"{where}: event {i} of {len(events)} has finish_reason {'set' if done else 'null'}")
    for i, (a, b) in enumerate(zip(events, events[1:])):
        before, after = a.get("output_ids") or [], b.get("output_ids") or []
        if after[: len(before)] != before or len(after) <= len(before):
            problems.append(
                f"{where}: event {i + 1} does not extend event {i}'s output ({len(before)} -> {len(after)} ids)"
            )
    return problems


def check_request(endpoint: str, body: Any, where: str) -> List[str]:
    """How a request body differs from what `endpoint` takes in SGLang (strictly: no unknown key)."""
    shape = fixtures.ENDPOINTS[endpoint]["request"]
    if shape is None:
        return [] if body in (None, "") else [f"{where}: {endpoint} takes no body, got {str(body)[:100]}"]
    return mismatches({} if body is None else body, shape, where, strict=True)  # `where` names the root


def _dig(value: Any, path: str) -> Any:
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _expectations(example: Dict[str, Any], text: str, where: str) -> List[str]:
    if not text.strip() or not ({"expect", "items"} & set(example)):
        return []
    value = json.loads(text)
    problems = []
    if "items" in example and (not isinstance(value, list) or len(value) != example["items"]):
        problems.append(f"{where}: expected a list of {example['items']} items, got {str(value)[:100]}")
    for item in value if isinstance(value, list) else [value]:
        for path, want in example.get("expect", {}).items():
            got = _dig(item, path)
            if got != want:
                problems.append(f"{where}: {path} is {got!r}, expected {want!r}")
    return problems


def _fill(body: Any, values: Dict[str, str]) -> Any:
    if isinstance(body, dict):
        return {k: _fill(v, values) for k, v in body.items()}
    if isinstance(body, list):
        return [_fill(v, values) for v in body]
    if isinstance(body, str) and body.startswith("{") and body.endswith("}") and body[1:-1] in values:
        return values[body[1:-1]]
    return body


def run_suite(
    url: str,
    *,
    control: bool = False,
    weights: bool = False,
    model_path: Optional[str] = None,
    strict: bool = False,
    api_key: str = "",
    timeout: float = 120.0,
    backend: str = "gloo",
    bind_host: str = "127.0.0.1",
    server_tp_size: int = 1,
) -> List[Outcome]:
    """One Outcome per endpoint of the fixtures, in their order. `backend`, `bind_host`,
    `server_tp_size` (the server's ranks in the weight group): for the broadcast of `weights`."""
    if weights and not model_path:
        raise ValueError("weights=True needs model_path: the weights to load (from disk, then broadcast)")
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    report = _Report()
    groups = {"read"} | ({"control"} if control else set()) | ({"weights"} if weights else set())
    version = _next_version(url, timeout, headers)
    values = {"model_path": str(model_path or ""), "next_version": str(version)}
    info = {}
    for ex in fixtures.EXAMPLES:
        endpoint, where = ex["endpoint"], f"{ex['name']!r}"
        if ex["group"] not in groups:
            report.skip(endpoint, f"--{ex['group']}")
            continue
        if ex.get("needs") == "tokenizer" and info.get("tokenizer_path") is None:
            report.skip(endpoint, f"{ex['name']!r} needs a tokenizer; the server has none")
            continue
        body = _fill(copy.deepcopy(ex["request"]), values)
        status, ctype, text = _call(url + endpoint, ex["method"], body, timeout, headers)
        problems = check_answer(status, ctype, text, ex["status"], ex["answer"], strict, where)
        if not problems:
            problems = _expectations(ex, text, where)
        report.check(endpoint, problems)
        if endpoint == "/get_model_info" and status == 200:
            info = _json_object(text)
    if weights:
        broadcast = (backend, bind_host, server_tp_size)
        _weights_by_realhfs_clients(url, model_path, version + 1, report, strict, api_key, timeout, broadcast)
    else:
        for endpoint in ("/init_weights_update_group", "/update_weights_from_distributed"):
            report.skip(endpoint, "--weights")
    return list(report.outcomes.values())


def _next_version(url: str, timeout: float, headers: Dict[str, str]) -> int:
    """One above the version the server serves (1 when it serves a name such as "default")."""
    status, _, text = _call(f"{url}/get_model_info", "GET", None, timeout, headers)
    served = parse_weight_version(_json_object(text).get("weight_version")) if status == 200 else None
    return 1 if served is None else served + 1


def _json_object(text: str) -> Dict[str, Any]:
    """`text` as a JSON object; {} when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _weights_by_realhfs_clients(
    url: str,
    model_path: str,
    version: int,
    report: _Report,
    strict: bool,
    api_key: str,
    timeout: float,
    broadcast: Tuple[str, str, int],
) -> None:
    """realhf's manager update (from disk) and the trainer's broadcast, through a recording proxy."""
    import aiohttp
    import torch
    from transformers import AutoModelForCausalLM

    from realhf.base.secret import auth_headers
    from realhf.system.manager.weight_update import update_server
    from realhf.system.trainer.weight_broadcast import WeightBroadcaster
    from realhf.testing.sglang_conformance.recorder import Recorder

    headers = auth_headers(api_key)
    backend, bind_host, ranks_per_server = broadcast

    async def manager_update(proxy_url: str) -> None:
        async with aiohttp.ClientSession() as session:
            await update_server(session, proxy_url, model_path, version, timeout)

    with Recorder(target=url, timeout=timeout, headers=headers) as rec:
        try:
            asyncio.run(manager_update(rec.url))
        except Exception as e:  # noqa: BLE001 - reported as the endpoint's failure, the calls checked below
            report.check("/update_weights_from_disk", [f"realhf's manager update failed: {e}"])
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto")
        if backend == "nccl":
            model = model.to("cuda")  # NCCL broadcasts from the GPU
        broadcaster = WeightBroadcaster(
            lambda: [rec.url], bind_host, backend, timeout, 1 << 20, ranks_per_server=ranks_per_server, pause=True
        )
        try:
            with torch.no_grad():
                result = broadcaster.publish(version + 1, model.state_dict().items())
            if not result.ok:
                report.check("/update_weights_from_distributed", [f"the trainer's broadcast failed: {result.failed}"])
            inits = rec.calls_to("/init_weights_update_group")
            if inits and isinstance(inits[-1].body, dict):
                # Leave the group as the trainer does when the servers change; waited on here.
                name = inits[-1].body.get("group_name")
                _call(f"{rec.url}/destroy_weights_update_group", "POST", {"group_name": name}, timeout, {})
        finally:
            broadcaster.close()
        answers = {
            "/pause_generation": fixtures.STATUS_OK,
            "/continue_generation": fixtures.STATUS_OK,
            "/update_weights_from_disk": fixtures.WEIGHTS_FROM_DISK_ANSWER,
            "/init_weights_update_group": fixtures.SUCCESS_MESSAGE,
            "/update_weights_from_distributed": fixtures.WEIGHTS_FROM_DISTRIBUTED_ANSWER,
            "/destroy_weights_update_group": fixtures.SUCCESS_MESSAGE,
        }
        seen = set()
        for i, call in enumerate(rec.calls):
            if call.path not in answers:
                report.check(call.path, [f"realhf's weight-update clients called {call.path}, which they should not"])
                continue
            if call.path == "/destroy_weights_update_group" and call.path in seen:
                continue  # the broadcaster's own, after the group was left: not waited on, not checked
            seen.add(call.path)
            where = f"realhf's call {i + 1} ({call.method} {call.path})"
            problems = check_request(call.path, call.body, f"{where}: request")
            problems += check_answer(
                call.status,
                call.content_type,
                call.text,
                200,
                {"content": "json", "shape": answers[call.path]},
                strict,
                where,
            )
            report.check(call.path, problems)
        for path in answers:
            if path not in seen:
                report.check(path, [f"realhf's weight-update clients never called {path}"])
    status, _, text = _call(f"{url}/get_model_info", "GET", None, timeout, headers)
    served = _json_object(text).get("weight_version") if status == 200 else None
    report.check(
        "/get_model_info",
        [] if served == str(version + 1) else [f"after the broadcast of version {version + 1} it reports {served!r}"],
    )
