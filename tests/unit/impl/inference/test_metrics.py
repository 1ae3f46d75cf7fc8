"""`/metrics` of the native server: SGLang's metric names with the numbers of `Engine.stats()`."""

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from realhf.impl.inference.engine import EngineStats
from realhf.impl.inference.metrics import engine_registry


class FakeEngine:
    def __init__(self, stats):
        self._stats = stats

    def stats(self):
        return self._stats


def test_metrics_carry_sglang_names_model_label_and_the_engine_stats():
    stats = EngineStats(
        running=3,
        queued=5,
        paused=True,
        weight_version=7,
        n_slots=16,
        context_len=512,
        token_usage=0.25,
        prompt_tokens_total=100,
        generation_tokens_total=40,
        requests_total=9,
        aborted_total=2,
        gen_throughput=12.5,
    )
    text = generate_latest(engine_registry(FakeEngine(stats), 'my "model"')).decode()
    samples = {s.name: s for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert {name: s.value for name, s in samples.items()} == {
        "sglang:num_running_reqs": 3,
        "sglang:num_queue_reqs": 5,
        "sglang:token_usage": 0.25,
        "sglang:gen_throughput": 12.5,
        "sglang:max_running_requests": 16,
        "sglang:context_len": 512,
        "sglang:prompt_tokens_total": 100,
        "sglang:generation_tokens_total": 40,
        "sglang:num_requests_total": 9,
        "sglang:num_aborted_requests_total": 2,
        "realhf:weight_version": 7,
        "realhf:paused": 1,
    }
    assert all(s.labels == {"model_name": 'my "model"'} for s in samples.values())
    assert "# TYPE sglang:generation_tokens_total counter" in text


def test_a_registry_reads_the_engine_at_scrape_time():
    base = dict(
        queued=0,
        paused=False,
        weight_version=0,
        n_slots=4,
        context_len=8,
        token_usage=0.0,
        prompt_tokens_total=0,
        generation_tokens_total=0,
        requests_total=0,
        aborted_total=0,
        gen_throughput=0.0,
    )
    engine = FakeEngine(EngineStats(running=1, **base))
    registry = engine_registry(engine, "m")
    engine._stats = EngineStats(running=2, **base)
    assert 'sglang:num_running_reqs{model_name="m"} 2.0' in generate_latest(registry).decode()
