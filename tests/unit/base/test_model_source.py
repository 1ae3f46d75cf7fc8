"""A model path may be a Hugging Face Hub repo id: resolved once, at config validation, to a local
snapshot every worker reads; offline (HF_HUB_OFFLINE=1, or no network) a repo id with no cached
copy fails at once, naming the field, the path and offline mode, before any process starts."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from helpers.paths import REPO, TINY_MATH
from realhf.base.model_source import HUB_TIMEOUT_S, looks_like_repo_id, resolve_model_path
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validate import validate_experiment as check_config
from realhf.experiments.validation import ConfigError

MISSING = "realhf-test/NoSuchModel-135M-Instruct"


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


def test_offline_a_hub_id_fails_config_validation_at_once_naming_offline_mode_and_the_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    with pytest.raises(
        ConfigError,
        match=rf"^actor.path='{MISSING}' is not a local directory, the hub is offline "
        r"\(HF_HUB_OFFLINE=1\) and no copy is cached; run scripts/convert_gguf.py",
    ):
        check_config(compose_config([f"actor.path={MISSING}"]))
    assert time.monotonic() - t0 < 5


def test_without_a_reachable_hub_a_hub_id_fails_within_the_timeout_naming_the_path(monkeypatch):
    # This machine kind has no network: the hub is unreachable. With one, the id is not a model.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.monotonic()
    with pytest.raises(
        ConfigError,
        match=rf"^ref.path='{MISSING}' is (not a local directory, the hub is "
        r"unreachable|neither a local directory nor a model the hub serves)",
    ):
        check_config(compose_config([f"ref.path={MISSING}", "ppo.kl_ctl=0.1"]))
    assert time.monotonic() - t0 < 2 * HUB_TIMEOUT_S + 5


def test_offline_a_cached_hub_snapshot_becomes_the_local_path_every_worker_reads(monkeypatch, tmp_path):
    import huggingface_hub.constants

    # The hub cache's layout with one snapshot of the tiny-math SFT model under a repo id.
    repo = tmp_path / "models--realhf-test--tiny-math-sft"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(os.path.join(TINY_MATH, "sft"), snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_config(["actor.path=realhf-test/tiny-math-sft"])
    check_config(cfg)
    assert cfg.actor.path == str(snapshot)


def test_local_directories_and_deeper_paths_are_never_taken_for_repo_ids():
    assert not looks_like_repo_id(os.path.join("assets", "tiny-math"))  # exists
    assert not looks_like_repo_id("assets/tiny-math/no-such-dir")  # three parts: a path
    assert not looks_like_repo_id("/nonexistent/model")
    assert not looks_like_repo_id("../model") and not looks_like_repo_id("")
    assert looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct") and looks_like_repo_id("gpt2")
    assert resolve_model_path("actor.path", "/nonexistent/model") == "/nonexistent/model"  # left to the path checks


@pytest.mark.system
def test_the_command_line_refuses_an_offline_hub_id_before_starting_anything(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", f"actor.path={MISSING}", f"cluster.fileroot={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"actor.path='{MISSING}' is not a local directory, the hub is offline (HF_HUB_OFFLINE=1)" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched
