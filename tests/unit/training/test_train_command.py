"""The training command from any directory (issue 29 item 6): `python -m realhf.apps.train`, which
the console script `realhf-train` runs, finds its configs wherever it is started; an installed
(not editable) package carries the configs and the tiny-math assets and trains on them."""

import os
import shutil
import subprocess
import sys

import pytest

from helpers.paths import REPO
from realhf.base.trial_files import TrialFiles, read_metrics

pytestmark = pytest.mark.system

SMALL = [
    "groups_per_step=4",
    "group_size=4",
    "max_concurrent_rollouts=8",
    "evaluation.n_prompts=0",
    "ppo.gen.max_new_tokens=24",
    "cluster.device=cpu",
]


@pytest.mark.slow  # ~10 s under load; CI: test_user_data_config.py validates the default config from another directory
def test_the_command_module_answers_help_from_another_directory(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "realhf.apps.train", "--help", "dataset.split=mine"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "python -m realhf.apps.train [key=value ...]" in proc.stdout
    # The YAML's values (found from here) merged with the override.
    assert "assets/tiny-math/data/train.jsonl" in proc.stdout and "mine" in proc.stdout


@pytest.mark.slow  # ~30 s: builds the package and trains 8 steps with it
def test_an_installed_package_trains_from_any_directory_through_its_console_script(tmp_path, no_leftover_processes):
    # Built from a copy: pip builds in the source tree, which must stay clean.
    src = tmp_path / "src"
    for path in ("setup.py", "requirements.txt", "realhf", "training", "assets/tiny-math"):
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, path)) else shutil.copy
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        copy(os.path.join(REPO, path), src / path)
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    proc = subprocess.run([*install, "--target", str(target), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (target / "realhf" / "_bundled" / "assets" / "tiny-math" / "sft" / "model.safetensors").is_file()
    shutil.rmtree(src)  # nothing of the checkout is left to be found
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(target))
    script = str(target / "bin" / "realhf-train")
    proc = subprocess.run(
        [script, "trial_name=pkg", f"cluster.fileroot={work}", "exp_ctrl.benchmark_steps=8", *SMALL],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"using realhf's own copy {target}/realhf/_bundled/assets/tiny-math/sft" in out
    metrics = read_metrics(TrialFiles(str(work), "async-ppo", "pkg").log_dir)
    assert [m["step"] for m in metrics] == list(range(1, 9))
