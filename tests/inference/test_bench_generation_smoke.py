"""`python -m scripts.bench.generation --short` runs end to end and reports its JSON line (no speed assertion)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_generation_short_prints_a_table_and_a_json_line(no_leftover_processes):
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.generation", "--short"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["bench"] == "generation"
    assert [r["concurrency"] for r in result["results"]] == [32, 4]
    for r in result["results"]:
        assert r["native_tok_s"] > 0 and r["hf_tok_s"] > 0 and r["ratio"] > 0
    assert any("ratio" in line for line in lines[:-1])


def test_bench_generation_profile_prints_the_decode_step_breakdown(no_leftover_processes):
    proc = subprocess.run([sys.executable, "-m", "scripts.bench.generation", "--short", "--profile"],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "ms/step" in out and "at 32 slots" in out
    for block in ("attention", "mlp", "sampling", "rms_norm", "rope", "other"):
        assert block in out, out
