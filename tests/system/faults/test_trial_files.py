"""Issue 14 items 4 and 8: a run deletes nothing it was not asked to. Without a trial_name each
run gets a fresh one (the README's first command works twice in a row and keeps the first run);
a trial_name whose files exist is refused (saying how to overwrite, resume or rename) unless
overwrite=true. Temporary and superseded checkpoint directories are pruned at the start."""

import importlib.util
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from realhf.api.cli_args import AsyncPPOConfig, ClusterSpecConfig
from realhf.base.trial_files import TrialFiles


@pytest.fixture(scope="module")
def main_async_ppo():
    spec = importlib.util.spec_from_file_location(
        "main_async_ppo_under_test", os.path.join(REPO, "training", "main_async_ppo.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cfg(tmp_path, **kw):
    return AsyncPPOConfig(cluster=ClusterSpecConfig(fileroot=str(tmp_path)), **kw)


def _earlier_run(tmp_path, trial):
    files = TrialFiles(str(tmp_path), "async-ppo", trial)
    os.makedirs(os.path.join(files.run_dir, "published_weights", "actor", "3"))
    os.makedirs(files.log_dir)
    with open(files.metrics_path, "w") as f:
        f.write('{"step": 1}\n')
    return files


def test_rerunning_a_named_trial_is_refused_saying_how_to_overwrite_resume_or_rename(tmp_path):
    files = _earlier_run(tmp_path, "t1")
    proc = subprocess.run(
        [
            sys.executable,
            "training/main_async_ppo.py",
            "trial_name=t1",
            f"cluster.fileroot={tmp_path}",
            "evaluation.n_prompts=0",
            "exp_ctrl.benchmark_steps=1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "trial_name=t1 already has files" in proc.stderr
    assert "overwrite=true" in proc.stderr and "recover_mode=auto" in proc.stderr
    assert open(files.metrics_path).read() == '{"step": 1}\n'  # the earlier run is untouched
    assert os.path.isdir(os.path.join(files.run_dir, "published_weights", "actor", "3"))


def test_overwrite_true_deletes_the_earlier_run_and_resume_keeps_it(tmp_path, main_async_ppo):
    files = _earlier_run(tmp_path, "t2")
    assert main_async_ppo.claim_trial(_cfg(tmp_path, trial_name="t2", recover_mode="auto")) is None
    assert os.path.isfile(files.metrics_path)  # resuming deletes nothing
    assert main_async_ppo.claim_trial(_cfg(tmp_path, trial_name="t2", overwrite=True)) is None
    assert not os.path.exists(files.log_dir) and not os.path.exists(files.run_dir)


def test_without_a_trial_name_every_run_gets_a_fresh_one(tmp_path):
    # Two runs of the entry point without trial_name (what the README's first command does
    # twice): the config each would use names a different trial, so the second deletes nothing.
    script = (
        "from realhf.experiments.config_loading import compose_config; "
        "print(compose_config(['cluster.fileroot=/x']).trial_name)"
    )
    names = [
        subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
        ).stdout.split()[-1]
        for _ in range(2)
    ]
    assert names[0] != names[1] and all(n.startswith("run-") for n in names), names


def test_leftover_temporary_directories_and_saves_beyond_keep_last_saves_are_pruned(tmp_path, main_async_ppo):
    run_dir = tmp_path / "run"
    saves = run_dir / "checkpoints" / "actor"
    for v in (2, 4, 6, 8, 10):
        (saves / f"version{v}").mkdir(parents=True)
    published = run_dir / "published_weights" / "actor"
    for name in ("7", ".tmp-8-abc", ".old-7-123"):
        (published / name).mkdir(parents=True)
    (saves / ".tmp-version12-xyz").mkdir()
    (run_dir / ".tmp-recover").mkdir()
    (run_dir / "recover").mkdir()
    main_async_ppo.prune_run_dir(str(run_dir), keep_last_saves=3)
    assert sorted(p.name for p in saves.iterdir()) == ["version10", "version6", "version8"]
    assert sorted(p.name for p in published.iterdir()) == ["7"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "published_weights", "recover"]
    main_async_ppo.prune_run_dir(str(run_dir), keep_last_saves=0)  # 0: keep every save
    assert len(list(saves.iterdir())) == 3
