"""Where the per-step metrics go besides metrics.jsonl, each read back through the real library:
wandb (offline: files only, the run's config attached), tensorboard (EventAccumulator) and
Prometheus (a real HTTP scrape, parsed by prometheus_client's parser)."""

import json
import urllib.request

import pytest

from realhf.base.network import find_free_port
from realhf.system.stats.stats_logger import EVAL_METRICS_FILE, StatsLogger


def _rows():
    """Three steps as the master logs them (the fields the sinks and the bar read)."""
    return [
        {
            "step": s,
            "version": s,
            "reward_mean": -0.5 + 0.25 * s,
            "success_rate": 0.125 * s,
            "n_samples": 16,
            "samples_per_s": 8.0,
            "head_offpolicyness_max": s - 1,
            "loss": 1.0 / s,
            "actor_inf_behav_abs_diff": 0.5,
        }
        for s in (1, 2, 3)
    ]


@pytest.mark.system
def test_wandb_offline_run_holds_every_logged_step_and_the_runs_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from helpers.wandb_offline import offline_run
    from realhf.api.cli_args import AsyncPPOConfig
    from realhf.experiments.async_ppo import wandb_run_config

    for var, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / sub))  # nothing written outside tmp_path
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = AsyncPPOConfig(seed=7)
    cfg.cluster.name_resolve.redis_url = "redis://:hunter2@127.0.0.1:6379/0"
    log_dir = tmp_path / "logs"
    stats = StatsLogger(
        str(log_dir / "metrics.jsonl"),
        wandb_project="realhf-test",
        wandb_run_name="exp/trial",
        wandb_mode="offline",
        wandb_config=wandb_run_config(cfg),
        echo=False,
    )
    for row in _rows():
        stats.log(row)
    stats.close()

    config, history = offline_run(str(log_dir))
    assert [h["_step"] for h in history] == [1, 2, 3]
    assert [h["reward_mean"] for h in history] == [-0.25, 0.0, 0.25]
    assert [h["loss"] for h in history] == [1.0, 0.5, 1.0 / 3]

    # The whole root config, nested as in the YAML; the Redis password never leaves the machine.
    def value(key):
        return config[key]["value"] if isinstance(config[key], dict) and "value" in config[key] else config[key]

    assert value("seed") == 7 and value("ppo")["kl_ctl"] == cfg.ppo.kl_ctl
    assert value("cluster")["name_resolve"]["redis_url"] == "redis://:***@127.0.0.1:6379/0"
    assert "hunter2" not in json.dumps(config)


def test_tensorboard_events_read_back_with_the_logged_values(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    stats = StatsLogger(str(tmp_path / "metrics.jsonl"), tensorboard_path=str(tmp_path / "tb"), echo=False)
    for row in _rows():
        stats.log(row)
    stats.close()

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"reward_mean", "success_rate", "loss", "head_offpolicyness_max"} <= set(events.Tags()["scalars"])
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(1, -0.25), (2, 0.0), (3, 0.25)]
    assert [e.value for e in events.Scalars("success_rate")] == [0.125, 0.25, 0.375]


def _scrape(url):
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        text = r.read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_prometheus_endpoint_serves_the_latest_step_and_stops_with_the_logger(tmp_path):
    port = find_free_port()
    stats = StatsLogger(str(tmp_path / "metrics.jsonl"), prometheus_port=port, echo=False)
    try:
        assert stats.prometheus_url == f"http://127.0.0.1:{port}/metrics"
        assert not any(k.startswith("realhf_train_") for k in _scrape(stats.prometheus_url))  # no step yet
        rows = _rows()
        stats.log(rows[0])
        assert _scrape(stats.prometheus_url)["realhf_train_reward_mean"] == -0.25
        stats.log(rows[1])
        got = _scrape(stats.prometheus_url)
        assert got["realhf_train_step"] == 2 and got["realhf_train_reward_mean"] == 0.0
        assert got["realhf_train_success_rate"] == 0.25 and got["realhf_train_samples_per_s"] == 8.0
        assert got["realhf_train_head_offpolicyness_max"] == 1 and got["realhf_train_loss"] == 0.5
        assert got["realhf_train_actor_inf_behav_abs_diff"] == 0.5
        assert not any(k.startswith("realhf_eval_") for k in got)  # no evaluation yet
        with open(tmp_path / EVAL_METRICS_FILE, "w") as f:  # the evaluator's row, beside metrics.jsonl
            f.write(json.dumps({"step": 2, "version": 2, "eval/accuracy": 0.375, "eval/pass_at_k": 0.5}) + "\n")
        got = _scrape(stats.prometheus_url)
        assert got["realhf_eval_accuracy"] == 0.375 and got["realhf_eval_pass_at_k"] == 0.5
        assert got["realhf_eval_version"] == 2
    finally:
        stats.close()
    with pytest.raises(OSError):  # closed with the logger: the port is free again
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_prometheus_port_taken_fails_naming_the_field(tmp_path):
    port = find_free_port()
    first = StatsLogger(str(tmp_path / "a.jsonl"), prometheus_port=port, echo=False)
    try:
        with pytest.raises(OSError, match="stats.prometheus_port"):
            StatsLogger(str(tmp_path / "b.jsonl"), prometheus_port=port, echo=False)
    finally:
        first.close()
