"""Where a model path points: a local HF directory, or a Hugging Face Hub repo id turned into a
local snapshot directory once, before any process starts.

Every worker (trainer ranks, generation servers, rollout workers' tokenizers) then reads the
same local files: resolving in each process would race downloads and could mix revisions. When
the hub cannot be used — `HF_HUB_OFFLINE` set, or no network (this project's machines download
nothing at run time) — a repo id without a cached snapshot fails here, at once, naming the field,
the path and offline mode, instead of as a timeout inside a worker.
"""

from __future__ import annotations

import os
import re

# What a model directory needs: configs, weights, tokenizer files and chat template; never the
# pickled *.bin / *.pt weights realhf refuses to load anyway.
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "tokenizer.model"]
# Seconds to wait for the hub's first answer: an unreachable hub fails the config check quickly.
HUB_TIMEOUT_S = 5.0
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
_FIX = "run scripts/convert_gguf.py or give a local model directory"


class ModelPathError(ValueError):
    """A model path that is neither a local directory nor a hub model this machine can get."""


def hub_offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, but read now (the library reads it at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def looks_like_repo_id(path: str) -> bool:
    """`name` or `org/name` that is not an existing file or directory."""
    return bool(path) and not os.path.exists(path) and bool(_REPO_ID.match(path)) and ".." not in path


def resolve_model_path(field: str, path: str) -> str:
    """`path` itself unless it is a hub repo id; then the local snapshot directory of that repo
    (downloaded if the hub is reachable, else from the local cache). Raises ModelPathError."""
    if not looks_like_repo_id(path):
        return path
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    offline = hub_offline()
    try:
        return snapshot_download(path, allow_patterns=HUB_FILES, etag_timeout=HUB_TIMEOUT_S, local_files_only=offline)
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise ModelPathError(
            f"{field}={path!r} is neither a local directory nor a model the hub serves ({type(e).__name__}); {_FIX}"
        ) from None
    except Exception as e:  # noqa: BLE001 - every other failure is the hub being out of reach
        why = "the hub is offline (HF_HUB_OFFLINE=1)" if offline else f"the hub is unreachable ({type(e).__name__})"
        raise ModelPathError(
            f"{field}={path!r} is not a local directory, {why} and no copy is cached; {_FIX}"
        ) from None
