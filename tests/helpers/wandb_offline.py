"""Read an offline wandb run back: the records of its `run-<id>.wandb` transaction log.

wandb 0.2x+ no longer ships a Python reader of that file, so this is the few lines of its
documented framing: a 7-byte header (`:W&B`, a 2-byte magic, a version byte), then 32 KiB blocks
of chunks — CRC32 (4 bytes), length (2, little-endian), type (1: FULL, 2: FIRST, 3: MIDDLE,
4: LAST) and the payload — each whole payload a `wandb_internal_pb2.Record` protobuf.
"""

import glob
import json
import os
import struct
from typing import Dict, List, Tuple

from helpers.wait import wait_for

BLOCK = 32 * 1024
HEADER = 7
CHUNK_HEADER = 7


def records(path: str) -> List[object]:
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    out, pos, pending = [], HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # the rest of a block too short for a chunk: padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        payload = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            continue
        pending += payload
        if kind in (1, 4):  # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def _finished_log(wandb_dir: str) -> List[object]:
    found = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
    assert len(found) <= 1, found
    run = records(found[0]) if found else []
    return run if any(r.WhichOneof("record_type") == "exit" for r in run) else []


def offline_run(wandb_dir: str, timeout: float = 30) -> Tuple[Dict[str, object], List[Dict[str, object]]]:
    """(the run's config as {top-level key: value}, the logged history rows) of the one offline
    run under `<wandb_dir>/wandb/`. wandb's service may write the log's last records after
    `finish()` returned: this waits for its `exit` record."""
    config, history = {}, []
    for r in wait_for(lambda: _finished_log(wandb_dir), timeout, f"a finished offline wandb run in {wandb_dir}", 0.2):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in r.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in r.config.update})
        elif kind == "history":
            history.append(
                {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
            )
    return config, history
