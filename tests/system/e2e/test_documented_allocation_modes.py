"""Issue 26, item 5: every `allocation_mode` the README and docs/ show parses, and every one this
machine can run (the native engine) starts and trains a few steps, with the overrides written
beside it in the same code span. An sglang mode (GPU servers) must be refused on a CPU machine
with a message that says what to use instead."""

import re
from pathlib import Path
from typing import Dict, List

import pytest

from helpers.paths import REPO
from helpers.training_runs import SMALL_RUN, run_training
from helpers.training_runs import trial_processes as _trial_processes
from realhf.base.allocation_mode import AllocationMode

MODE = re.compile(r"\b(?:native|sglang)\.[dmp\d]+\+[dmp\d]+")
# Modes a longer run of the suite already starts with the documented overrides (checked below, so
# the two cannot drift apart): not started twice (CI time).
STARTED_ELSEWHERE = {
    "native.d1m1p1+d3m1p1": ("test_data_parallel_runs.py", "test_grpo_trains_at_dp3"),
    "native.d1m1p1+d1m2p1": ("test_model_parallel_runs.py", "test_a_tensor_parallel_trainer_runs_the_whole_system"),
    "native.d1m1p1+d1m1p2": ("test_model_parallel_runs.py", "test_a_pipelined_trainer_runs_the_whole_system"),
}
SPAN = re.compile(r"`([^`\n]+)`")


def documented_modes() -> Dict[str, List[str]]:
    """mode -> the other `key=value` overrides of the code span it first appears in."""
    docs = [Path(REPO) / "README.md", *sorted((Path(REPO) / "docs").glob("*.md"))]
    found: Dict[str, List[str]] = {}
    for doc in docs:
        for span in SPAN.findall(doc.read_text()):
            for mode in MODE.findall(span):
                extra = [t for t in span.split() if "=" in t and not t.startswith("allocation_mode=")]
                found.setdefault(mode, extra)
    return found


def _overrides(mode: str, extra: List[str]) -> List[str]:
    """SMALL_RUN, 2 steps, with the doc's own overrides winning (Hydra refuses a key given twice)."""
    dp = AllocationMode.parse(mode).train.dp
    base = dict(o.split("=", 1) for o in SMALL_RUN)
    base.pop("max_concurrent_rollouts")  # the default's room is what a documented batch size needs
    base.update(
        {
            "groups_per_step": str(4 if 4 % dp == 0 else 2 * dp),
            "rollout.n_workers": str(max(2, dp)),
            "exp_ctrl.benchmark_steps": "2",
            "allocation_mode": mode,
        }
    )
    base.update(dict(o.split("=", 1) for o in extra))
    return [f"{k}={v}" for k, v in base.items()]


def test_the_docs_show_the_modes_users_start_with():
    modes = documented_modes()
    assert {"native.d1m1p1+d1m1p1", "native.d2m1p1+d2m1p1", "native.d1m1p1+d3m1p1"} <= set(modes), modes


@pytest.mark.e2e
@pytest.mark.parametrize("mode", sorted(documented_modes()))
def test_a_documented_allocation_mode_starts_and_trains(mode, tmp_path, no_leftover_processes):
    alloc = AllocationMode.parse(mode)
    extra = documented_modes()[mode]
    if mode in STARTED_ELSEWHERE:
        file, test = STARTED_ELSEWHERE[mode]
        source = (Path(__file__).parent / file).read_text()
        body = source[source.index(f"def {test}(") :]
        body = body[: body.find("\ndef ", 1) if "\ndef " in body[1:] else len(body)]
        for override in [f"allocation_mode={mode}", *extra]:
            assert f'"{override}"' in body, f"{file}::{test} no longer starts {override}"
        return
    if alloc.gen_engine == "sglang":
        proc, metrics, _ = run_training(tmp_path, "mode", *_overrides(mode, extra), timeout=120)
        assert proc.returncode != 0 and "needs GPUs" in proc.stdout + proc.stderr and not metrics
        return
    proc, metrics, log_dir = run_training(tmp_path, "mode", *_overrides(mode, extra), timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == [1, 2], out[-3000:]
    assert len(list(log_dir.glob("model_worker-*.log"))) == alloc.train.world_size
    assert len(list(log_dir.glob("generation_server-*.log"))) == alloc.gen.dp
    assert _trial_processes(str(tmp_path)) == []
