"""What the master says when no train step completes for a while: who waits for what.

A stalled asynchronous run has many possible culprits — a DP rank whose rollout workers died,
admission refusing everything (staleness or the concurrency cap), a generation server that stopped
answering, a trainer dropping every group as stale. `stall_report` gathers one snapshot of each, with
short timeouts so that reporting never becomes the next hang:

    data        per DP rank: groups held / needed, received, stale-dropped, invalid
    manager     GET /status: version, running, accepted, capacity (total and per DP rank: a rank
                out of budget while another is short is the deadlock per-rank admission prevents),
                rejections by reason, servers
    servers     GET /health of every registered generation server
    workers     heartbeats present per worker type, and which indices are missing
    loops       each async worker whose event loop is blocked now: for how long, and where
                (its heartbeat comes from a thread, so a frozen loop still looks alive)
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Dict, List, Optional, Sequence

from realhf.base import name_resolve, names
from realhf.base.secret import auth_headers

HTTP_TIMEOUT_S = 2.0


def _http_get(url: str, secret: str = "", timeout: float = HTTP_TIMEOUT_S) -> str:
    request = urllib.request.Request(url, headers=auth_headers(secret))  # the run's endpoints want its secret
    with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 - loopback/cluster URLs only
        return r.read().decode("utf-8", "replace")


def _describe_error(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}"
    if isinstance(e, urllib.error.URLError):
        return f"unreachable ({e.reason})"
    return f"{type(e).__name__}: {e}"


def data_lines(replies: Sequence[dict], shares: Sequence[int]) -> List[str]:
    return [
        f"dp rank {r['dp_rank']}: holds {r['buffered']}/{shares[r['dp_rank']]} groups (received {r['received']}, "
        f"stale-dropped {r['stale_dropped']}, invalid {r['invalid']})"
        for r in replies
    ]


def manager_line(experiment: str, trial: str, secret: str = "") -> str:
    try:
        url = name_resolve.get(names.gserver_manager(experiment, trial))
    except name_resolve.NameEntryNotFoundError:
        return "manager: not registered"
    try:
        s = json.loads(_http_get(f"{url}/status", secret))
    except Exception as e:  # noqa: BLE001 - any failure is what we report
        return f"manager {url}: /status failed: {_describe_error(e)}"
    rejections = ", ".join(f"{k} {v}" for k, v in sorted(s.get("rejections", {}).items())) or "none"
    servers = "; ".join(
        [f"{x['url']} requests={x['requests']} version={x['version']}" for x in s.get("servers", [])]
        + [
            f"{x['url']} joining for {x['waited_s']:.0f}s at version={x['version']} (not routed until it holds "
            f"version {s.get('version')})"
            for x in s.get("joining", [])
        ]
    )
    return (
        f"manager {url}: version {s.get('version')}, running {s.get('running')}, accepted {s.get('accepted')}, "
        f"capacity {s.get('capacity')} (per DP rank {s.get('per_rank', {}).get('capacity')}), "
        f"stale-dropped {s.get('stale_dropped')}, rejections: {rejections}; "
        f"servers: {servers or 'none'}"
    )


def server_lines(experiment: str, trial: str, secret: str = "") -> List[str]:
    urls = sorted(set(name_resolve.get_subtree(names.gen_servers(experiment, trial))))
    if not urls:
        return ["generation servers: none registered"]
    out = []
    for url in urls:
        try:
            _http_get(f"{url}/health", secret)
            out.append(f"generation server {url}: healthy")
        except Exception as e:  # noqa: BLE001
            out.append(f"generation server {url}: /health failed: {_describe_error(e)}")
    return out


def worker_line(experiment: str, trial: str, expected: Dict[str, int]) -> str:
    root = names.worker_root(experiment, trial) + "/"
    alive: Dict[str, List[int]] = {}
    for key in name_resolve.find_subtree(names.worker_root(experiment, trial)):
        parts = key[len(root) :].split("/")
        if len(parts) == 2 and parts[1].isdigit():
            alive.setdefault(parts[0], []).append(int(parts[1]))
    described = []
    for wtype in sorted(set(alive) | set(expected)):
        have = sorted(alive.get(wtype, []))
        missing = [i for i in range(expected.get(wtype, 0)) if i not in have]
        described.append(
            f"{wtype} {len(have)}/{expected.get(wtype, len(have))} alive" + (f" (missing {missing})" if missing else "")
        )
    return "workers: " + (", ".join(described) or "no heartbeat registered")


def blocked_loop_lines(experiment: str, trial: str) -> List[str]:
    root = names.loop_blocked_root(experiment, trial) + "/"
    out = []
    for key in name_resolve.find_subtree(names.loop_blocked_root(experiment, trial)):
        try:
            v = json.loads(name_resolve.get(key))
            what = f"blocked for at least {v['blocked_for_s']}s at {v['where']}"
        except name_resolve.NameEntryNotFoundError:
            continue  # it ran again meanwhile
        except (ValueError, KeyError, TypeError):
            what = "blocked (unreadable report)"
        out.append(f"{key[len(root) :]}: event loop {what}; nothing else on it runs meanwhile (its log has the stack)")
    return out


def stall_report(
    experiment: str,
    trial: str,
    replies: Sequence[dict],
    shares: Sequence[int],
    expected_workers: Optional[Dict[str, int]] = None,
    secret: str = "",
) -> List[str]:
    """One line per fact; never raises (a broken probe becomes a line saying so)."""
    lines = data_lines(replies, shares)
    for probe in (
        lambda: [manager_line(experiment, trial, secret)],
        lambda: server_lines(experiment, trial, secret),
        lambda: [worker_line(experiment, trial, expected_workers or {})],
        lambda: blocked_loop_lines(experiment, trial),
    ):
        try:
            lines.extend(probe())
        except Exception as e:  # noqa: BLE001 - e.g. name resolve unreachable
            lines.append(f"probe failed: {_describe_error(e)}")
    return lines
