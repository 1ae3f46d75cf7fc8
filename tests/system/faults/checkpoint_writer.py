"""A recovery-checkpoint writer to be SIGKILLed mid-save (test_checkpoint_crash.py).

    python tests/system/faults/checkpoint_writer.py OUT_DIR PAUSE_AT

Saves version 1 of a tiny actor, writes its parameters to OUT_DIR/v1.safetensors, trains one
step, writes v2.safetensors and saves version 2 slowly: it prints `PAUSED <where>` and sleeps
when it reaches PAUSE_AT, `shards` (after the first engine's shards were written into the
temporary directory) or `switch` (right after the first rename or exchange of a directory at the
checkpoint's path, i.e. inside the replace).
"""

import os
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))  # tests/ for helpers

from helpers.fsdp_ranks import engine_config, full_params, open_engines, run_steps  # noqa: E402

from realhf.impl.model import checkpoint, recover_checkpoint  # noqa: E402


def pause(where: str) -> None:
    print(f"PAUSED {where}", flush=True)
    time.sleep(600)


def main(out: Path, pause_at: str) -> None:
    torch.set_num_threads(1)
    path = out / "recover"
    with open_engines(engine_config()) as (actor,):
        recover_checkpoint.save(path, {"actor": actor}, 0, 1, actor.device, extra={"version": 1})
        save_file(full_params(actor), out / "v1.safetensors")
        run_steps(actor, [0], 0, 1)
        save_file(full_params(actor), out / "v2.safetensors")
        if pause_at == "shards":
            save_recover = actor.save_recover

            def slow_save_recover(dest):
                save_recover(dest)
                pause("shards")

            actor.save_recover = slow_save_recover
        else:  # every way a directory can be switched: Path.rename, os.rename, the exchange
            rename, os_rename = Path.rename, os.rename

            def touches_checkpoint(*paths):  # torch.distributed.checkpoint renames its own files
                return any(Path(p).resolve() == path.resolve() for p in paths)

            def slow_rename(src, dst):
                result = rename(src, dst)
                if touches_checkpoint(src, dst):
                    pause(f"switch rename {Path(src).name} -> {Path(dst).name}")
                return result

            def slow_os_rename(src, dst, *a, **kw):
                os_rename(src, dst, *a, **kw)
                if touches_checkpoint(src, dst):
                    pause(f"switch os.rename {src} -> {dst}")

            Path.rename, os.rename = slow_rename, slow_os_rename
            if hasattr(checkpoint, "_exchange"):
                exchange = checkpoint._exchange

                def slow_exchange(a, b):
                    exchange(a, b)
                    pause(f"switch exchange {Path(a).name} <-> {Path(b).name}")

                checkpoint._exchange = slow_exchange
        recover_checkpoint.save(path, {"actor": actor}, 0, 1, actor.device, extra={"version": 2})
        print("SAVED 2", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
