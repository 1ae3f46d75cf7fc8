"""The native engine's numbers as Prometheus metrics, under SGLang's names.

SGLang's metric names (`sglang:*`) so that a scraper — and the manager — reads either server the
same way, plus realhf's weight version and pause state. A collector reads `Engine.stats()` at
scrape time, so the decode loop never touches a metric object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry, exposition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from realhf.impl.inference.engine import Engine

# The type of the text format `generate_latest` writes; older prometheus-client releases have no
# CONTENT_TYPE_PLAIN_0_0_4 and call it CONTENT_TYPE_LATEST.
PROMETHEUS_CONTENT_TYPE = getattr(exposition, "CONTENT_TYPE_PLAIN_0_0_4", exposition.CONTENT_TYPE_LATEST)

# (name, type, help, field of EngineStats)
_METRICS = (
    ("sglang:num_running_reqs", "gauge", "Requests being decoded.", "running"),
    ("sglang:num_queue_reqs", "gauge", "Requests waiting for a slot.", "queued"),
    ("sglang:token_usage", "gauge", "Fraction of KV-cache tokens in use.", "token_usage"),
    ("sglang:gen_throughput", "gauge", "Generated tokens per second (recent).", "gen_throughput"),
    ("sglang:max_running_requests", "gauge", "KV-cache slots.", "n_slots"),
    ("sglang:context_len", "gauge", "Tokens per slot.", "context_len"),
    ("sglang:prompt_tokens_total", "counter", "Prompt tokens prefilled.", "prompt_tokens_total"),
    ("sglang:generation_tokens_total", "counter", "Tokens generated.", "generation_tokens_total"),
    ("sglang:num_requests_total", "counter", "Requests finished (any reason).", "requests_total"),
    ("sglang:num_aborted_requests_total", "counter", "Requests finished by abort.", "aborted_total"),
    ("realhf:weight_version", "gauge", "Version of the weights being served.", "weight_version"),
    ("realhf:paused", "gauge", "1 while generation is paused.", "paused"),
)


class EngineCollector:
    """Every metric of `_METRICS` from one `engine.stats()`, labelled with the served model name."""

    def __init__(self, engine: Engine, model_name: str):
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats()
        for name, kind, help_, field in _METRICS:
            make = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = make(name, help_, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(stats, field)))
            yield family


def engine_registry(engine: Engine, model_name: str) -> CollectorRegistry:
    """A registry of its own per server (not the process-global one), holding the engine's metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model_name))
    return registry
