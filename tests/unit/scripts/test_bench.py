"""Each benchmark of `scripts/bench` runs in --short mode and ends with its JSON line of numbers.

Benchmarks measure and never assert speed, so neither do these tests: they check that each one
runs, exits 0, leaves no process behind, and reports the figures its docs promise (positive).
"""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.system


def run_bench(*args, timeout=600):
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) > 1, "a table is printed before the JSON line"
    return json.loads(lines[-1]), proc.stdout


def assert_positive(result, keys):
    for key in keys:
        assert isinstance(result[key], (int, float)) and result[key] > 0, f"{key} = {result.get(key)!r}"


def generation_bench(*flags):
    """stdout of `scripts.bench.generation --short` (its output has no single shape to parse)."""
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench.generation", "--short", *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_bench_generation_short_prints_a_table_and_a_json_line(no_leftover_processes):
    lines = generation_bench().strip().splitlines()
    result = json.loads(lines[-1])
    assert result["bench"] == "generation"
    assert [r["concurrency"] for r in result["results"]] == [32, 4]
    for r in result["results"]:
        assert r["native_tok_s"] > 0 and r["hf_tok_s"] > 0 and r["ratio"] > 0
    assert any("ratio" in line for line in lines[:-1])


def test_bench_generation_profile_prints_the_decode_step_breakdown(no_leftover_processes):
    out = generation_bench("--profile")
    assert "ms/step" in out and "at 32 slots" in out
    for block in ("attention", "mlp", "sampling", "rms_norm", "rope", "other"):
        assert block in out, out


def test_stream_bench_reports_stream_and_raw_rates(no_leftover_processes):
    result, _ = run_bench("scripts.bench.stream", "--short")
    assert result["bench"] == "stream"
    assert_positive(
        result,
        [
            "stream_msgs_per_s",
            "stream_mb_per_s",
            "raw_msgs_per_s",
            "raw_mb_per_s",
            "stream_over_raw_mb_per_s",
            "msg_bytes",
            "from_msg_ms",
        ],
    )


def test_manager_bench_reports_requests_per_second(no_leftover_processes):
    result, _ = run_bench("scripts.bench.manager", "--short")
    assert result["bench"] == "manager"
    assert_positive(result, ["requests_per_s", "rollouts_per_s", "p50_ms"])
    assert result["errors"] == 0


@pytest.mark.slow  # CI time; the suite's entry point and the other benchmarks' smoke runs stay
def test_weight_update_bench_reports_disk_and_distributed_per_server_count(no_leftover_processes):
    result, _ = run_bench("scripts.bench.weight_update", "--short")
    assert result["bench"] == "weight_update"
    assert_positive(result, ["tiny_model_update_s", "tiny_model_distributed_s"])
    rows = {(r["model"], r["n_servers"]) for r in result["rows"]}
    assert rows == {("tiny", 1), ("tiny", 2), ("medium", 1), ("medium", 2)}
    for r in result["rows"]:
        assert r["distributed_median_s"] > 0 and r["disk_update_median_s"] > 0 and r["disk_save_median_s"] > 0


def test_trainer_bench_times_both_ways_of_doing_a_step(no_leftover_processes):
    result, _ = run_bench("scripts.bench.trainer", "--short")
    assert result["bench"] == "trainer"
    assert_positive(result, ["baseline_s", "current_s", "speedup", "n_tokens"])
    phases = result["default_phases"]  # where the default's step goes: its three calls
    assert set(phases) == {"actor_inf", "ref_inf", "actor_train"} and all(v > 0 for v in phases.values())
    assert sum(phases.values()) <= result["current_s"] * 1.01  # the fastest repeat's own parts


@pytest.mark.slow  # CI time; the suite's entry point and the other benchmarks' smoke runs stay
def test_engine_bench_times_unwrapped_fsdp_and_dp2(no_leftover_processes):
    result, _ = run_bench("scripts.bench.engine", "--short")
    assert result["bench"] == "engine"
    assert_positive(
        result, ["unwrapped_s", "fsdp_s", "fsdp_over_unwrapped", "dp1_s", "dp2_s", "dp_speedup", "n_tokens"]
    )
    assert [w["way"] for w in result["dp1"]["ways"]] == ["unwrapped", "fsdp"]
    assert [(r["dp"], r["sharded"]) for r in result["dp"]["runs"]] == [(1, False), (2, True)]


def test_suite_entry_point_writes_markdown_and_json(tmp_path, no_leftover_processes):
    # Through the stream benchmark, the quickest (~3 s); each benchmark's own numbers are checked above.
    _, stdout = run_bench("scripts.bench", "stream", "--short", "--out-dir", str(tmp_path))
    assert json.loads(stdout.strip().splitlines()[-1])["bench"] == "stream"
    doc = json.loads((tmp_path / "benchmarks.json").read_text())
    assert doc["machine"]["cores"] > 0 and doc["machine"]["cpu_model"]
    entry = doc["results"]["stream"]
    assert entry["_mode"] == "short" and len(entry["_load_before"]) == 3
    # Hosts of one machine kind differ in vector instructions (and then ~2x in speed): every
    # result says which it ran on.
    assert entry["_cpu_flags"] == doc["machine"]["cpu_flags"] and entry["_cpu_flags"] != ""
    assert_positive(entry, ["stream_msgs_per_s"])
    md = (tmp_path / "benchmarks.md").read_text()
    assert "### stream" in md and "load average" in md and f"CPU {entry['_cpu_flags']}, " in md
    # A second run regenerates the marked part and keeps text written outside it.
    (tmp_path / "benchmarks.md").write_text(md + "\n## Optimisations\n\nhand-written notes\n")
    run_bench("scripts.bench", "stream", "--short", "--out-dir", str(tmp_path))
    md2 = (tmp_path / "benchmarks.md").read_text()
    assert md2.count("### stream") == 1 and "hand-written notes" in md2


@pytest.mark.slow
def test_e2e_bench_reports_async_over_sync(no_leftover_processes):
    result, _ = run_bench("scripts.bench.e2e", "--short", timeout=1200)
    assert result["bench"] == "e2e"
    assert_positive(result, ["async_over_sync_samples_per_s", "async_over_sync_gen_tokens_per_s"])
    for run in ("async", "sync"):
        assert_positive(result[run], ["samples_per_s", "gen_tokens_per_s", "wall_s", "step_time_s"])
        assert "sampled_acc_after" in result[run]


@pytest.mark.slow
def test_scaling_bench_reports_every_axis_and_a_linearity_figure(no_leftover_processes):
    result, _ = run_bench("scripts.bench.scaling", "--short", timeout=1800)
    assert result["bench"] == "scaling"
    assert set(result["axes"]) == {
        "rollout.n_workers",
        "max_concurrent_rollouts",
        "group_size",
        "ppo.gen.max_new_tokens",
    }
    for points in result["axes"].values():
        assert len(points) >= 2
        for p in points:
            assert_positive(p, ["samples_per_s", "step_time_s"])
    assert "max_new_tokens_linearity_r2" in result
    assert_positive(result, ["rollout_workers_last_over_first_samples_per_s"])


@pytest.mark.slow
def test_data_parallel_bench_reports_samples_per_s_and_token_balance_per_dp_size(no_leftover_processes):
    result, _ = run_bench("scripts.bench.data_parallel", "--short", timeout=1800)
    assert result["bench"] == "data_parallel"
    assert set(result["runs"]) == {"1", "2", "3"}
    for runs in result["runs"].values():
        assert_positive(runs[0], ["samples_per_s", "dp_token_imbalance", "dp_token_imbalance_before"])
        assert runs[0]["dp_token_imbalance"] <= runs[0]["dp_token_imbalance_before"] + 1e-9
    assert result["token_imbalance"]["1"]["dp_token_imbalance"] == 1.0


@pytest.mark.slow  # CI: test_bench_generation_short (the same script), e2e/test_smollm2_run.py (the weights)
def test_generation_sizes_short_measures_both_sides_on_the_real_smollm2_weights(smollm2_path, no_leftover_processes):
    result, out = run_bench("scripts.bench.generation_sizes", "--short", "--smollm2-path", smollm2_path)
    assert result["bench"] == "generation_sizes"
    assert 130e6 < result["model_params"]["smollm2-135m"] < 140e6
    (row,) = result["results"]
    assert row["model"] == "smollm2-135m" and row["concurrency"] == 8
    assert_positive(row, ["native_tok_s", "hf_tok_s", "ratio"])
    assert "engine/HF" in out


def test_trial_restart_bench_times_a_trial_restart_and_a_worker_restarted_alone(no_leftover_processes):
    """Both kinds of victim: Redis (the trial restarts from its checkpoint) and the manager
    (restarted alone while the run goes on); each row's times ordered as the bench defines them."""
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench.trial_restart", "--repeats", "1", "--steps", "10", "--kill-at", "3"]
        + ["--ckpt", "2", "--victims", "redis-server,gserver_manager-0"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = {
        cells[0]: cells[1:]
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| killed")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    noticed, healed, again, exits = rows["redis-server"]
    assert 0 < float(noticed) < float(healed) and int(again) >= 0 and exits == "0", rows
    noticed, healed, longest_wait, median_step, exits = rows["gserver_manager-0"]
    # healed includes the launcher's 1 s restart backoff, which starts when it noticed
    assert 0 < float(noticed) < float(healed) and float(healed) >= 1.0, rows
    assert float(longest_wait) > 0 and exits == "0", rows
