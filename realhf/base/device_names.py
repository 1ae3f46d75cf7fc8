"""The values `cluster.device` takes, and whether the installed torch could see a GPU at all, apart
from `realhf.base.device` so that config validation and the processes that never touch a tensor
(launcher, manager) need not import torch (a second of CPU each at start-up, on two shared cores)."""

from __future__ import annotations

import importlib.util
import os
import re

DEVICE_NAMES = ("auto", "cpu", "cuda")


def torch_built_for_gpu() -> bool:
    """False when the installed torch is a CPU-only build (its `torch/version.py` says `cuda` and
    `hip` are None), read without importing torch; such a build never sees a GPU, so
    `cluster.device=auto` means the CPU. True otherwise, unknown layouts included: then ask torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        with open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")) as f:
            text = f.read()
    except OSError:
        return True
    return not all(re.search(rf"^{name}\b[^=\n]*=\s*None\s*$", text, re.M) for name in ("cuda", "hip"))
