"""A recovery-checkpoint writer to be SIGKILLed mid-save (test_checkpoint_crash.py).

    python tests/system/faults/checkpoint_writer.py OUT_DIR PAUSE_AT [renames]

Saves versions 1 and 2 of a tiny actor (a step between them), writing the parameters of each
version v to OUT_DIR/v<v>.safetensors, trains one more step, writes v3.safetensors and saves
version 3 slowly: it prints `PAUSED <where>` and sleeps when it reaches PAUSE_AT, `shards` (after
the first engine's shards were written into the temporary directory), `switch` (right after the
first rename or exchange of a directory at `recover`, i.e. inside the replace) or `previous`
(right after the first one at `recover.prev`, where the replaced checkpoint is kept). With
`renames`, every save replaces directories as on a filesystem without RENAME_EXCHANGE (NFS).
"""

import errno
import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/ for helpers

from helpers.fsdp_ranks import engine_config, full_params, open_engines, run_steps  # noqa: E402
from realhf.base import trial_files  # noqa: E402
from realhf.impl.model import checkpoint, recover_checkpoint  # noqa: E402


def pause(where: str) -> None:
    print(f"PAUSED {where}", flush=True)
    time.sleep(600)


def no_exchange(a, b):
    raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")


def pause_in_shards(actor) -> None:
    save_recover = actor.save_recover

    def slow_save_recover(dest):
        save_recover(dest)
        pause("shards")

    actor.save_recover = slow_save_recover


def pause_at_switch_of(target: Path) -> None:
    """Pause right after any rename (Path.rename, os.rename) or exchange that touches `target`."""
    rename, os_rename, exchange = Path.rename, os.rename, checkpoint._exchange

    def touches(*paths):  # torch.distributed.checkpoint renames its own files
        return any(Path(p).resolve() == target.resolve() for p in paths)

    def slow_rename(src, dst):
        result = rename(src, dst)
        if touches(src, dst):
            pause(f"switch rename {Path(src).name} -> {Path(dst).name}")
        return result

    def slow_os_rename(src, dst, *a, **kw):
        os_rename(src, dst, *a, **kw)
        if touches(src, dst):
            pause(f"switch os.rename {src} -> {dst}")

    def slow_exchange(a, b):
        exchange(a, b)
        if touches(a, b):
            pause(f"switch exchange {Path(a).name} <-> {Path(b).name}")

    Path.rename, os.rename, checkpoint._exchange = slow_rename, slow_os_rename, slow_exchange


def main(out: Path, pause_at: str, renames: bool) -> None:
    torch.set_num_threads(1)
    if renames:
        checkpoint._exchange = no_exchange
    path = trial_files.recover_dir(out)
    with open_engines(engine_config()) as (actor,):
        for version in (1, 2, 3):
            if version > 1:
                run_steps(actor, [version - 2], 0, 1)
            save_file(full_params(actor), out / f"v{version}.safetensors")
            if version == 3:
                if pause_at == "shards":
                    pause_in_shards(actor)
                else:
                    pause_at_switch_of(path if pause_at == "switch" else trial_files.recover_prev_dir(out))
            recover_checkpoint.save(path, {"actor": actor}, 0, 1, actor.device, extra={"version": version})
        print("SAVED 3", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:] == ["renames"])
