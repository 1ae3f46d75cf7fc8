"""What the GserverManager reports about itself: finished-rollout throughput over a sliding
window (in `/status`) and the Prometheus exposition of its status (`/metrics`).

`/metrics` is rendered by `prometheus-client` from the same status dict `/status` answers with,
so the two never disagree.
"""

from __future__ import annotations

import collections
import time
from typing import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

THROUGHPUT_WINDOW_S = 60.0

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class ThroughputWindow:
    """Totals of finished rollouts, and their token and rollout rates over the last `window_s` s
    (or since start, if that is shorter)."""

    def __init__(self, window_s: float = THROUGHPUT_WINDOW_S, clock: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self.t0 = clock()
        self.n_finished = 0
        self.n_filtered = 0
        self.total_tokens = 0
        self._recent = collections.deque()  # (time, n_tokens) of finished rollouts

    def add(self, accepted: bool, n_tokens: int) -> None:
        self.n_finished += 1
        self.n_filtered += 0 if accepted else 1
        self.total_tokens += n_tokens
        self._recent.append((self._clock(), n_tokens))

    def summary(self) -> dict:
        now = self._clock()
        while self._recent and now - self._recent[0][0] > self.window_s:
            self._recent.popleft()
        window = min(self.window_s, max(now - self.t0, 1e-6))
        return {
            "window_s": round(window, 1),
            "tokens_per_s": sum(n for _, n in self._recent) / window,
            "rollouts_per_s": len(self._recent) / window,
            "total_tokens": self.total_tokens,
            "finished": self.n_finished,
            "filtered": self.n_filtered,
        }


class _StatusCollector:
    """Prometheus metric families of one manager status dict (see `ManagerService.status`)."""

    def __init__(self, status: dict):
        self.s = status

    def collect(self) -> Iterator[Metric]:
        s = self.s
        yield GaugeMetricFamily(
            "realhf_manager_version", "Trainer weight version admission counts against.", value=s["version"]
        )
        yield GaugeMetricFamily(
            "realhf_manager_running_rollouts", "Admitted rollouts not finished yet.", value=s["running"]
        )
        yield CounterMetricFamily(
            "realhf_manager_accepted_rollouts_total", "Rollouts finished and accepted.", value=s["accepted"]
        )
        yield CounterMetricFamily(
            "realhf_manager_stale_dropped_total",
            "Accepted rollouts the trainer dropped as stale.",
            value=s["stale_dropped"],
        )
        yield GaugeMetricFamily("realhf_manager_capacity", "Rollouts that may be admitted now.", value=s["capacity"])
        per_rank = GaugeMetricFamily(
            "realhf_manager_rank_capacity",
            "Rollouts pushed to this trainer DP rank that may be admitted now.",
            labels=["rank"],
        )
        for rank, capacity in enumerate(s["per_rank"]["capacity"]):
            per_rank.add_metric([str(rank)], capacity)
        yield per_rank
        rejections = CounterMetricFamily(
            "realhf_manager_rejections_total", "Refused allocations, by reason.", labels=["reason"]
        )
        for reason, n in s["rejections"].items():
            rejections.add_metric([reason], n)
        yield rejections
        yield CounterMetricFamily(
            "realhf_manager_generated_tokens_total",
            "Tokens of finished rollouts.",
            value=s["throughput"]["total_tokens"],
        )
        yield GaugeMetricFamily(
            "realhf_manager_joining_servers",
            "Healthy servers not routed until they hold the trainer's current weights.",
            value=len(s.get("joining", [])),
        )
        per_server = [
            ("requests", "realhf_manager_server_requests", "Samples of in-flight groups routed to the server."),
            (
                "tokens",
                "realhf_manager_server_tokens",
                "KV-cache tokens that in-flight groups may occupy on the server.",
            ),
            ("version", "realhf_manager_server_version", "Weight version the server holds."),
        ]
        for key, name, doc in per_server:
            family = GaugeMetricFamily(name, doc, labels=["url"])
            for server in s["servers"]:
                if server[key] is not None:  # a server whose version is not known yet
                    family.add_metric([server["url"]], server[key])
            yield family


def render_metrics(status: dict) -> bytes:
    """The Prometheus text exposition of a manager status dict."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatusCollector(status))
    return generate_latest(registry)
