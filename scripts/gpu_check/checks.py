"""What every stage shares: the machine it ran on, one record per check, the stage's JSON file.

A check is a function returning a dict of numbers; it fails by raising (CheckFailed for a number
out of its tolerance, anything else for a crash). Each check runs even when an earlier one failed,
so one stage on a rare GPU machine reports everything it can.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import traceback
from typing import Any, Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = os.path.join(REPO, "assets", "tiny-math", "sft")


class CheckFailed(AssertionError):
    """A number outside its tolerance; the message names both. `numbers`: what was measured,
    recorded with the failure."""

    def __init__(self, message: str, numbers: Dict[str, Any] | None = None):
        super().__init__(message)
        self.numbers = numbers or {}


class Skipped(Exception):
    """The check does not apply here (or what it checks is not built yet); the message says why."""


def log(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


def require(ok: bool, message: str) -> None:
    if not ok:
        raise CheckFailed(message)


def machine(device: str) -> Dict[str, Any]:
    import torch

    info: Dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": device,
        "cpus": os.cpu_count(),
        "host": platform.node(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), gpu_count=torch.cuda.device_count()
        )
    return info


class Stage:
    def __init__(self, name: str, out_dir: str, device: str):
        self.name, self.out_dir, self.device = name, out_dir, device
        self.records: List[Dict[str, Any]] = []
        self.t0 = time.monotonic()

    def run(self, name: str, fn: Callable[[], Dict[str, Any]]) -> Dict[str, Any]:
        t0 = time.monotonic()
        record: Dict[str, Any] = {"check": name}
        try:
            record.update(fn() or {})
            record["status"] = "ok"
        except CheckFailed as e:
            record.update(e.numbers, status="failed", error=str(e))
        except Skipped as e:
            record.update(status="skipped", reason=str(e))
        except Exception as e:  # noqa: BLE001 - every failure is recorded, the next check still runs
            record.update(status="failed", error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-3000:])
        record["seconds"] = round(time.monotonic() - t0, 2)
        self.records.append(record)
        self._write(done=False)  # a stage killed at its time limit still leaves what it measured
        shown = {k: v for k, v in record.items() if k not in ("check", "trace", "status")}
        log(f"{record['status'].upper():7s} {name} {json.dumps(shown, default=str)}")
        return record

    def _write(self, done: bool, extra: Dict[str, Any] | None = None) -> Dict[str, Any]:
        failed = [r["check"] for r in self.records if r["status"] == "failed"]
        result = {
            "stage": self.name,
            "machine": machine(self.device),
            "seconds": round(time.monotonic() - self.t0, 1),
            "finished": done,
            "ok": not failed,
            "failed": failed,
            "checks": self.records,
            **(extra or {}),
        }
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, f"{self.name}.json"), "w") as f:
            json.dump(result, f, indent=1, default=str)
        return result

    def finish(self, extra: Dict[str, Any] | None = None) -> int:
        result = self._write(done=True, extra=extra)
        n, failed = len(self.records), result["failed"]
        path = os.path.join(self.out_dir, f"{self.name}.json")
        log(f"{self.name}: {n - len(failed)}/{n} passed or skipped in {result['seconds']} s -> {path}")
        return 0 if not failed else 1


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def add_common_args(p) -> None:
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when torch sees a GPU)")
    p.add_argument("--out", default=os.path.join(REPO, "runs", "gpu_check"), help="folder for the JSON results")


def exit_code(code: int) -> int:
    sys.stdout.flush()
    return code
