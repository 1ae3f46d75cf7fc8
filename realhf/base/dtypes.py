"""The dtypes a model may be loaded in: their config names, and the torch dtype of each name.

`DTYPE_NAMES` is importable without torch, so config validation can check a `dtype` field before
any process (or torch) starts; `torch_dtype` imports torch only when called.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16")


def torch_dtype(name: str) -> "torch.dtype":
    """The torch dtype named `name`; ValueError naming the allowed names for anything else."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_NAMES)}, got {name!r}")
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]
