"""SFT's data parallelism over real processes: `train_sft` with dp=2 starts two rank processes
(python -m realhf.apps.sft_rank) over gloo, which take the steps DP=1 takes on the same batches —
with and without LoRA — and write the same model; a rank that fails or hangs ends the run with its
error (the hang within collective_timeout, naming the rank, the call and the step) and leaves no
process behind; Ctrl-C ends every rank (the planted faults: tests/helpers/sft_faults)."""

import math
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from helpers.fsdp_ranks import TINY_SFT
from helpers.paths import REPO, TESTS_DIR, TINY_MATH
from realhf.api.cli_args import LoRAConfig, SFTConfig
from realhf.base.process import pid_alive
from realhf.experiments.sft import SFTRankError, train_sft

pytestmark = pytest.mark.system

BASE = os.path.join(TINY_MATH, "base")
TRAIN = os.path.join(TINY_MATH, "data", "train.jsonl")


def _config(out, **overrides) -> SFTConfig:
    # 3 steps of 10 rows from the random-init base (large, varied gradients), a warm-up step and
    # cosine; 150 padded tokens per micro-batch: a rank's 5 rows take 2-3 forwards and the ranks
    # need not run as many (the one with fewer runs padding forwards: the engine's agreed plan).
    fields = dict(
        model_path=BASE, output_path=str(out), train_path=TRAIN, max_train_rows=64, steps=3, batch_size=10,
        warmup_steps=1, eval_n=-1, device="cpu", micro_batch_tokens=150, log_interval=1,
    )  # fmt: skip
    return SFTConfig(**{**fields, **overrides})


def _max_diff(a_dir, b_dir) -> float:
    a, b = load_file(f"{a_dir}/model.safetensors"), load_file(f"{b_dir}/model.safetensors")
    assert set(a) == set(b)  # the same plain HF layout (a tied LM head stored once by both)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dp2_takes_the_steps_dp1_takes_on_the_same_batches(tmp_path, lora, no_leftover_processes):
    extra = {"lora": LoRAConfig(r=4, alpha=8.0), "model_path": TINY_SFT} if lora else {}
    threads = torch.get_num_threads()
    try:
        dp1 = train_sft(_config(tmp_path / "dp1", **extra), log=lambda _: None)
        dp2 = train_sft(_config(tmp_path / "dp2", dp=2, **extra), log=lambda _: None)
    finally:
        torch.set_num_threads(threads)
    assert dp2["dp"] == 2 and 0.3 < dp2["rank_token_share"] < 0.7  # rank 0 trained about half the tokens
    assert len(dp2["losses"]) == 3 and all(math.isfinite(x) for x in dp2["losses"])
    assert dp2["losses"] == pytest.approx(dp1["losses"], abs=1e-5)
    # Within 2% of one AdamW step (lr 3e-3 peak): gloo's all-reduce sums in another order than one
    # rank does, and Adam magnifies that where a gradient is near eps (1.3e-5 seen on an AVX2 host).
    assert _max_diff(tmp_path / "dp1", tmp_path / "dp2") < 0.02 * 3e-3
    # The same plain HF directory: files, modes (readable by all) and the source's generation config.
    files = sorted(p.name for p in (tmp_path / "dp1").iterdir())
    assert files == sorted(p.name for p in (tmp_path / "dp2").iterdir()) and "tokenizer.json" in files
    for name in files:
        assert (
            (tmp_path / "dp1" / name).stat().st_mode & 0o777
            == (tmp_path / "dp2" / name).stat().st_mode & 0o777
            == 0o644
        )
    gen = "generation_config.json"
    assert (tmp_path / "dp1" / gen).read_text() == (tmp_path / "dp2" / gen).read_text()
    if not lora:
        assert dp1["losses"][-1] < dp1["losses"][0]  # it trained (from the random-init base)
    else:
        # Only the adapters trained: rank 4 on every projection of the 2 layers (measured here).
        assert (dp2["n_trainable"], dp2["n_params"]) == (dp1["n_trainable"], dp1["n_params"]) == (23552, 582272)
        # The output is the merged model under plain HF names, no adapter left in it.
        assert not any("lora" in k or "base_layer" in k for k in load_file(str(tmp_path / "dp2" / "model.safetensors")))
        assert _max_diff(tmp_path / "dp2", TINY_SFT) > 1e-4  # and the adapters moved it


def _plant(monkeypatch, fault: str) -> None:
    planted = os.path.join(TESTS_DIR, "helpers", "sft_faults")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([planted, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SFT_FAULT", fault)


def test_a_rank_that_fails_ends_the_others_at_once_with_its_error(tmp_path, monkeypatch, no_leftover_processes):
    _plant(monkeypatch, "raise")
    # A timeout far longer than the test: only the failure itself may end rank 0's wait.
    cfg = _config(tmp_path / "out", dp=2, steps=20, collective_timeout=300.0)
    start = time.monotonic()
    with pytest.raises(SFTRankError) as e:
        train_sft(cfg, log=lambda _: None)
    assert str(e.value).startswith("rank 1/2: RuntimeError: planted fault: rank 1 fails at its second step")
    assert "the other ranks were stopped" in str(e.value)
    assert "sitecustomize.py" in e.value.traceback  # where it was raised, for the console
    assert time.monotonic() - start < 60
    assert not (tmp_path / "out").exists()


def test_a_rank_that_hangs_ends_the_run_within_collective_timeout_naming_rank_call_and_step(
    tmp_path, monkeypatch, no_leftover_processes
):
    _plant(monkeypatch, "hang")
    cfg = _config(tmp_path / "out", dp=2, steps=20, collective_timeout=5.0)
    with pytest.raises(SFTRankError) as e:
        train_sft(cfg, log=lambda _: None)
    assert str(e.value).startswith(
        "rank 0/2: CollectiveTimeoutError: dp rank 0/2: sft train, step 2: a collective did not complete "
        "within 5s (collective_timeout)"
    ), str(e.value)


def test_ctrl_c_ends_the_command_and_every_rank(tmp_path):
    cmd = [
        sys.executable, "training/main_sft.py", f"model_path={BASE}", f"output_path={tmp_path / 'out'}",
        f"train_path={TRAIN}", "max_train_rows=64", "steps=100000", "batch_size=8", "eval_n=-1", "device=cpu",
        "log_interval=1", "dp=2",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:  # until both ranks train
            lines.append(line)
            if line.startswith("step 2/"):
                break
        ranks = [p.pid for p in psutil.Process(proc.pid).children() if "realhf.apps.sft_rank" in " ".join(p.cmdline())]
        assert len(ranks) == 2, "".join(lines)
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "interrupted: every rank stopped" in rest
    deadline = time.monotonic() + 5
    while any(pid_alive(p) for p in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in ranks if pid_alive(p)]
