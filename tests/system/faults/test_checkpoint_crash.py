"""Issue 14 item 4, issue 27 item 8: a recovery-checkpoint writer SIGKILLed in the middle of a save
(while writing the shards, inside the replace of the newest checkpoint, or inside the move of the
replaced one to `recover.prev`; with RENAME_EXCHANGE and with plain renames as on NFS) leaves
every checkpoint at its final name whole, one that `choose` picks and that loads and equals the
state saved then; the next save removes what the killed one left behind and keeps two."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from helpers.fsdp_ranks import engine_config, full_params, open_engines
from helpers.paths import REPO
from realhf.impl.model import recover_checkpoint

WRITER = os.path.join(os.path.dirname(__file__), "checkpoint_writer.py")


def _kill_writer_at(tmp_path, pause_at: str, mode: str) -> str:
    proc = subprocess.Popen(
        [sys.executable, WRITER, str(tmp_path), pause_at, mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


# (where the writer is killed while saving version 3, how directories are replaced, the version at
# each name it leaves); the newest whole one is resumed.
CASES = [
    ("shards", "exchange", {"recover": 2, "recover.prev": 1}),  # the new one only half written
    ("switch", "exchange", {"recover": 3, "recover.prev": 1}),  # version 2, at .tmp-recover, is lost
    ("previous", "exchange", {"recover": 3, "recover.prev": 2}),  # version 1 at .tmp-recover
    ("switch", "renames", {"recover.prev": 2}),  # version 3 not yet in place
    ("previous", "renames", {"recover": 2}),  # version 1 moved aside
]


@pytest.mark.parametrize("pause_at, mode, left", CASES, ids=[f"{p}-{m}" for p, m, _ in CASES])
def test_a_writer_killed_mid_save_leaves_a_whole_checkpoint_that_loads(
    tmp_path, pause_at, mode, left, no_leftover_processes
):
    where = _kill_writer_at(tmp_path, pause_at, mode)
    if pause_at != "shards":
        assert "recover" in where, where
    found = {
        name: recover_checkpoint.read_info(tmp_path / name)["version"]
        for name in ("recover", "recover.prev")
        if (tmp_path / name).exists()
    }
    assert found == left, (where, sorted(os.listdir(tmp_path)))
    for name in found:
        assert recover_checkpoint.verify(tmp_path / name) is None, where
    path, info = recover_checkpoint.choose(tmp_path)
    resumed = max(left.values())
    assert info["version"] == resumed
    expected = load_file(tmp_path / f"v{resumed}.safetensors")
    torch.set_num_threads(1)
    with open_engines(engine_config()) as (actor,):
        assert recover_checkpoint.load(path, {"actor": actor}, 0, actor.device)["version"] == resumed
        got = full_params(actor)
        assert sorted(got) == sorted(expected)
        for name, w in expected.items():
            assert torch.equal(got[name], w), name
        # The next save deletes what the killed one left (`.tmp-recover`, a swapped-out old copy).
        recover_checkpoint.save(tmp_path / "recover", {"actor": actor}, 0, 1, actor.device, extra={"version": 4})
    assert sorted(os.listdir(tmp_path)) == [
        "recover",
        "recover.prev",
        "v1.safetensors",
        "v2.safetensors",
        "v3.safetensors",
    ]
    assert recover_checkpoint.read_info(tmp_path / "recover")["version"] == 4
    assert recover_checkpoint.verify(tmp_path / "recover") is None
    assert recover_checkpoint.verify(tmp_path / "recover.prev") is None
