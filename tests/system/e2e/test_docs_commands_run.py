"""Every command the README and docs/ show, run as written (issue 28: "docs a newcomer can
follow, each runnable as written"): a training command runs for 2 steps (its own overrides kept,
the step count, the held-out evaluation, the trial's directory and the device appended), a warm
start for 2 steps into a temporary directory, `--help` and the checks as they are. A command that
is not run here says why (the suite itself, a benchmark whose short mode another test runs, the
user's own files or cluster); a command the docs gain that fits no rule fails this test until it
is given one. Slow: about 20 runs of 20-60 s each (tests/checks/test_docs.py validates every
command's config in CI)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from helpers.docs_commands import documented_commands
from helpers.paths import REPO

# Each distinct command once (the default run is shown on four pages), with the first page showing it.
_seen: set = set()
COMMANDS = [(p, c) for p, c in documented_commands() if not (c in _seen or _seen.add(c))]
PLACEHOLDER = re.compile(r"<\w+>|\[\w|…|\bHEAD_IP\b|\bDIR\b|\bFILE\b|\bPATH\b|=\.\.\.")
TRAINING = ("examples/run_async_ppo.sh", "examples/run_async_ppo_smollm2.sh", "examples/run_tool_agent.sh",
            "examples/run_code_task.sh", "examples/run_long_math.sh", "training/main_async_ppo.py")  # fmt: skip
SFT = "training/main_sft.py"
RM = "training/main_rm.py"
# Commands run elsewhere, by the test named, or not runnable here by nature.
NOT_RUN = {
    "scripts/test.sh": "the suite itself",
    "scripts.bench": "a benchmark (minutes): tests/unit/scripts/test_bench.py runs each in --short mode",
    "scripts/gpu_check.sh": "the GPU kit: tests/unit/scripts/test_gpu_check.py runs its stages on the CPU",
    "scripts/setup_env.sh": "the suite's own set-up: scripts/test.sh runs it (with `vllm` for the system lane)",
    "scripts.slowest_tests": "reads a run's JUnit reports: scripts/test.sh runs it at the end of every run; tests/unit/scripts/test_slowest_tests.py",
    "scripts/soak.sh": "a soak run by design (minutes to hours): tests/system/faults/test_chaos.py runs its kill loop",
    "realhf.launch_server": "a server that runs until stopped: tests/unit/test_launch_server.py starts one as documented",
    "realhf.testing.sglang_conformance": "a check of a running server: tests/unit/testing/test_sglang_conformance.py runs the command against the built-in one",
    "sglang.launch_server": "SGLang, a GPU extra not installed here",
    "realhf.impl.inference.sglang_entry": "SGLang's entry point, a GPU extra",
    "realhf.apps.remote": "the launcher's entry point of one worker, not a user's command",
    "realhf.apps.sft_rank": "one rank of training/main_sft.py, started by it",
    "realhf.apps.worker_template": "a shared template runs until stopped: tests/unit/scheduler/test_worker_template.py starts one as documented",
    "scripts/convert_gguf.py": "tests/unit/impl/model/test_gguf_import.py runs the conversion and the command",
    "scripts/make_math_dataset.py": "tests/assets/test_tiny_math.py regenerates the data with it",
    "scripts.make_preference_pairs": "rewrites the shipped pairs (a minute): tests/unit/scripts/test_make_preference_pairs.py runs it small",
}
CAP_RL = ["exp_ctrl.benchmark_steps=2", "evaluation.n_prompts=0", "cluster.device=cpu"]
CAP_SFT = ["steps=2", "eval_n=-1", "device=cpu"]
PATH_KEYS = re.compile(
    r"^\+?(actor\.path|critic\.path|ref\.path|reward\.path|dataset\.path|dataset\.test_path|model_path|train_path|test_path)=(.+)$"
)


def _not_run_reason(command: str, words):
    for key, why in NOT_RUN.items():
        if key in words or any(w.startswith(key) for w in words[:3]):
            return why
    if PLACEHOLDER.search(command):
        return "a pattern with the user's values to fill in"
    if "cluster.ray.address=" in command:
        return "the user's Ray cluster"
    if "gen_server.urls=" in command:
        return "servers started by hand first: tests/system/e2e/test_external_servers.py runs it with two"
    for w in words:
        m = PATH_KEYS.match(w)
        if m and not os.path.exists(os.path.join(REPO, m.group(2))):
            return f"names the user's own data or model ({m.group(2)})"
    return None


def _argv(words, tmp_path, index):
    """The command as run here: the venv's python, the caps appended (Hydra keeps the last value)."""
    program, args = words[0], words[1:]
    if program == "realhf-train":
        program, args = "python", ["-m", "realhf.apps.train", *args]
    if program in ("python", ".venv/bin/python"):
        program = sys.executable
    target = next((a for a in args if not a.startswith("-")), "")
    own = [f"cluster.fileroot={tmp_path}", f"trial_name=docs{index}"]
    if target in TRAINING or args[:2] == ["-m", "realhf.apps.train"]:
        if "--help" not in args:
            args = [*args, *CAP_RL, *own]
    elif target in (SFT, RM) and "--help" not in args:
        args = [*[a for a in args if not a.startswith("output_path=")], *CAP_SFT, f"output_path={tmp_path / 'sft'}"]
    elif args[:2] == ["-m", "pytest"]:
        args = [*args, "-q", "-p", "no:cacheprovider"]
    elif args[:2] not in (["-m", "scripts.make_config_docs"], ["-m", "scripts.memory_per_device"]):
        pytest.fail(f"`{' '.join(words)}`: no rule says how to run it here; add one (or a reason) to this test")
    return [program, *args]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[f"{p}:{c[:50]}" for p, c in COMMANDS])
def test_a_documented_command_runs_as_written(index, tmp_path, no_leftover_processes):
    page, command = COMMANDS[index]
    words = shlex.split(command)
    why = _not_run_reason(command, words)
    if why is not None:
        pytest.skip(f"{page}: `{command}`: not run here: {why}")
    argv = _argv(words, tmp_path, index)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{page}: `{command}` (run as {argv}) exited {proc.returncode}:\n{out[-4000:]}"
    if CAP_RL[0] in argv:
        assert "step 2" in out, f"{page}: `{command}` ran no second train step:\n{out[-3000:]}"
    if CAP_SFT[0] in argv:
        assert (tmp_path / "sft" / "model.safetensors").is_file(), out[-3000:]
