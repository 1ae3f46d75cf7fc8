"""Issue 14 item 4: a recovery-checkpoint writer SIGKILLed in the middle of a save (while writing
the shards, or inside the replace of the previous checkpoint) leaves a checkpoint that loads and
equals one that was saved whole; the next save removes what the killed one left behind."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from realhf.impl.model import recover_checkpoint

from helpers.fsdp_ranks import engine_config, full_params, open_engines
from helpers.paths import REPO

WRITER = os.path.join(os.path.dirname(__file__), "checkpoint_writer.py")


def _kill_writer_at(tmp_path, pause_at: str) -> str:
    proc = subprocess.Popen([sys.executable, WRITER, str(tmp_path), pause_at], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("PAUSED"):
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                return line.strip()
        raise AssertionError(f"the writer never paused at {pause_at}:\n" + "".join(lines))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("pause_at", ["shards", "switch"])
def test_a_writer_killed_mid_save_leaves_a_whole_checkpoint_that_loads(tmp_path, pause_at, no_leftover_processes):
    where = _kill_writer_at(tmp_path, pause_at)
    path = tmp_path / "recover"
    info = recover_checkpoint.read_info(path)
    assert info is not None, f"killed at {where!r}: no recovery checkpoint left ({sorted(os.listdir(tmp_path))})"
    version = info["version"]
    assert version in (1, 2), info
    if pause_at == "switch":
        assert "recover" in where, where
    if pause_at == "shards":
        assert version == 1  # the new one was only half written: the previous one stays
    expected = load_file(tmp_path / f"v{version}.safetensors")
    torch.set_num_threads(1)
    with open_engines(engine_config()) as (actor,):
        assert recover_checkpoint.load(path, {"actor": actor}, 0, actor.device)["version"] == version
        got = full_params(actor)
        assert sorted(got) == sorted(expected)
        for name, w in expected.items():
            assert torch.equal(got[name], w), name
        # The next save deletes what the killed one left (`.tmp-recover`, a swapped-out old copy).
        recover_checkpoint.save(path, {"actor": actor}, 0, 1, actor.device, extra={"version": 3})
    assert sorted(os.listdir(tmp_path)) == ["recover", "v1.safetensors", "v2.safetensors"]
    assert recover_checkpoint.read_info(path)["version"] == 3
