"""`load_tokenizer(path)`: what `AutoTokenizer.from_pretrained(path)` gives, without importing
torch where that can be avoided.

Importing `AutoTokenizer` imports torch (transformers' config classes do): ≈ 1.3 s of CPU and
hundreds of MB in every process that only encodes text — the rollout workers and the launcher,
at every start. The class AutoTokenizer picks for a folder depends only on the folder's files and
the libraries' versions; once picked, it is remembered (realhf.base.passed_checks, in the private
cache), and later loads import only that class and call its `from_pretrained` — AutoTokenizer's
own last step. A class from the folder's own code (trust_remote_code) or from outside
transformers is never remembered; a remembered one that fails to load falls back to
AutoTokenizer, which then says what is wrong.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from typing import Any

from realhf.base.passed_checks import KeyDigest, PassedChecks

# Files of a model directory that no tokenizer reads (weights): left out of a key.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx")
_MEMO = "tokenizer-class"


def add_tokenizer_files(key: KeyDigest, path: str) -> KeyDigest:
    """Digest the folder's files but its weights, and the versions of the libraries that
    tokenise and render chat templates (OSError when the folder cannot be read)."""
    key.add_files(e.path for e in os.scandir(path) if e.is_file() and not e.name.endswith(WEIGHT_SUFFIXES))
    for dist in ("transformers", "tokenizers", "jinja2"):
        try:
            key.add(dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            key.add(dist, None)
    return key


def _class_key(path: str) -> str:
    try:
        return add_tokenizer_files(KeyDigest(_MEMO), path).hexdigest()
    except OSError:
        return ""


def _remembered_class(name: str) -> Any:
    module, _, qualname = name.partition(":")
    if not module.startswith("transformers.") or not qualname.isidentifier():
        return None
    return getattr(importlib.import_module(module), qualname, None)


def load_tokenizer(path: str) -> Any:
    """The tokenizer of the HF folder `path`, as `AutoTokenizer.from_pretrained(path)` loads it."""
    key = _class_key(path)
    memo = PassedChecks(_MEMO)
    name = memo.value(key) if key else None
    if name:
        try:
            cls = _remembered_class(name)
            if cls is not None:
                return cls.from_pretrained(path)
        except Exception:  # noqa: BLE001 - AutoTokenizer below loads it, or says what is wrong
            pass
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    cls = type(tokenizer)
    if key and cls.__module__.startswith("transformers."):
        memo.record(key, f"{cls.__module__}:{cls.__qualname__}")
    return tokenizer
