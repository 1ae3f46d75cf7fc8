"""The training metrics as a Prometheus `/metrics` endpoint (stats.prometheus_port > 0).

Every number of the latest metrics.jsonl row becomes a gauge `realhf_train_<key>` (`step`,
`reward_mean`, `success_rate`, `samples_per_s`, `head_offpolicyness_max`, `loss`, …), so a
Prometheus scrape sees what the console line and metrics.jsonl show; the evaluator's latest
eval_metrics.jsonl row (its own process) is read at scrape time into `realhf_eval_<key>`
(`accuracy`, `pass_at_k`, `version`, …). As for the generation
servers (realhf/impl/inference/metrics.py), a collector reads the row at scrape time: logging a
step only swaps a reference. Read-only numbers, served by prometheus-client's own HTTP server
without authentication (scrapers rarely carry secrets) and bound to cluster.bind_host.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, Iterator, Optional

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

from realhf.base.network import host_for_peers

PREFIX = "realhf_train_"
EVAL_PREFIX = "realhf_eval_"

# Help of the fields people graph first; any other field says where it comes from.
_HELP = {
    "step": "Train steps completed.",
    "version": "Weight version after the latest step.",
    "reward_mean": "Mean reward of the latest step's samples.",
    "success_rate": "Fraction of the latest step's samples that succeeded.",
    "samples_per_s": "Samples trained per second in the latest step.",
    "head_offpolicyness_max": "Largest staleness (versions behind the trainer) of the latest step's samples.",
    "head_offpolicyness_mean": "Mean staleness (versions behind the trainer) of the latest step's samples.",
    "stale_dropped": "Groups dropped as too stale so far.",
    "loss": "Actor loss of the latest step.",
    "step_time_s": "Seconds of the latest step, waiting for data included.",
}


def metric_name(key: str, prefix: str = PREFIX) -> str:
    """`<prefix><key>` with every character Prometheus does not allow in a name made '_'."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def _numbers(row: Dict[str, Any]) -> Iterator[tuple]:
    for key, value in row.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            yield key, float(value)


def _last_row(path: str) -> Dict[str, Any]:
    """The last whole JSON line of `path` ({} if none yet)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return {}
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue  # a line the evaluator is writing
    return {}


class TrainingCollector:
    """Gauges of the latest logged metrics row (none before the first step) and of the latest
    evaluation in `eval_metrics_path`, if given."""

    def __init__(self, eval_metrics_path: Optional[str] = None):
        self._latest: Dict[str, Any] = {}
        self.eval_metrics_path = eval_metrics_path

    def update(self, row: Dict[str, Any]) -> None:
        self._latest = dict(row)  # one reference swap: a scrape sees one whole row

    def collect(self) -> Iterator[Metric]:
        for key, value in _numbers(self._latest):
            help_ = _HELP.get(key, f"metrics.jsonl field {key!r} of the latest train step.")
            yield GaugeMetricFamily(metric_name(key), help_, value=value)
        if self.eval_metrics_path:
            for key, value in _numbers(_last_row(self.eval_metrics_path)):
                yield GaugeMetricFamily(
                    metric_name(key.removeprefix("eval/"), EVAL_PREFIX),
                    f"eval_metrics.jsonl field {key!r} of the latest evaluation.",
                    value=value,
                )


class TrainingMetricsServer:
    """prometheus-client's HTTP server in a daemon thread, serving one `TrainingCollector`."""

    def __init__(self, host: str, port: int, eval_metrics_path: Optional[str] = None):
        self.collector = TrainingCollector(eval_metrics_path)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            raise OSError(f"stats.prometheus_port={port}: cannot serve /metrics on {host}:{port}: {e}") from None
        self.url = f"http://{host_for_peers(host)}:{self._server.server_port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
