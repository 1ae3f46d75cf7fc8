"""A Hugging Face hub dataset name as dataset.path (`owner/name`, its configuration in
dataset.config_name), loaded with `datasets.load_dataset` through the HF datasets cache.

The cache is tried first with the library held offline, so a dataset loaded once (by the config
check in the launcher, or on another day) never touches the network again: every rollout worker
and the evaluator read the same cached copy. Only when it is not cached, and HF_DATASETS_OFFLINE /
HF_HUB_OFFLINE is not set, does realhf ask the hub, first with one request bounded by
HUB_TIMEOUT_S (the library's own requests retry for ~25 s on a machine without network), then
with the download itself. Whatever fails, the error names the dataset, the offline setting, the
cache directory and the ways to get the data onto this machine.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Iterator

# Seconds to wait for the hub's answer to "does this dataset exist": no network fails quickly.
HUB_TIMEOUT_S = 5.0
# `owner/name` as the hub spells repo ids. A bare `name` is not taken for one (the hub's few
# un-namespaced datasets now live under an owner): it is far more often a mistyped file name.
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
# A name ending like a data file is a local path that does not exist, not a dataset on the hub.
_FILE_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".arrow", ".txt", ".tsv", ".gz", ".zst")


class HubDatasetError(ValueError):
    """A hub dataset name this machine cannot load; the message says why and what to do."""


def looks_like_hub_name(path: str) -> bool:
    """`owner/name` that is no local file or folder, whose `owner` is not a local folder either
    (`data/train` with a `data/` folder here is a mistyped local path), and that does not end
    like a data file."""
    return (
        bool(_HUB_NAME.match(path))
        and ".." not in path
        and not os.path.exists(path)
        and not os.path.isdir(path.split("/")[0])
        and not path.lower().endswith(_FILE_SUFFIXES)
    )


def offline(datasets: Any) -> bool:
    """HF_DATASETS_OFFLINE (else HF_HUB_OFFLINE) as the library read it at import."""
    return bool(datasets.config.HF_HUB_OFFLINE)


def _offline_setting() -> str:
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        if os.environ.get(name) is not None:
            return f"{name}={os.environ[name]}"
    return "HF_DATASETS_OFFLINE is not set"


@contextlib.contextmanager
def _cache_only(datasets: Any) -> Iterator[None]:
    # load_dataset has no local-files-only switch; it reads this flag at every call (the env
    # variable is read once, at import), and then falls back to the cached copy.
    before = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def _what_to_do(name: str, config_name: str) -> str:
    args = repr(name) + (f", {config_name!r}" if config_name else "")
    return (
        f"to use it, on a machine with network load it once with datasets.load_dataset({args}) under the same "
        "HF_HOME (that fills the cache, which runs here then read offline), or save it with "
        f"datasets.load_dataset({args}).save_to_disk(DIR) and set dataset.path=DIR (a folder of "
        "jsonl/csv/parquet files works as well)"
    )


def load_hub_dataset(datasets: Any, name: str, config_name: str = "") -> Any:
    """The `datasets.DatasetDict` of hub dataset `name` (all its splits). Raises HubDatasetError."""
    config = config_name or None
    where = (
        f"{name!r}{f' (dataset.config_name={config_name})' if config_name else ''} is neither a local file or "
        f"folder (none at {os.path.abspath(name)}) nor a Hugging Face dataset this machine can load"
    )
    cache = datasets.config.HF_DATASETS_CACHE
    try:
        with _cache_only(datasets):
            return datasets.load_dataset(name, config)
    except ValueError as e:
        if "config" in str(e).lower():  # cached, but not this configuration (or none was named)
            raise HubDatasetError(f"{where}: {e}; choose one with dataset.config_name") from None
        cached_error = e
    except Exception as e:  # noqa: BLE001 - not cached (ConnectionError, FileNotFoundError): ask the hub below
        cached_error = e
    not_cached = f"it is not in the datasets cache {cache} ({type(cached_error).__name__})"
    if offline(datasets):
        raise HubDatasetError(
            f"{where}: {not_cached} and the hub may not be asked ({_offline_setting()}); {_what_to_do(name, config_name)}"
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().dataset_info(name, timeout=HUB_TIMEOUT_S)
    except GatedRepoError:
        raise HubDatasetError(
            f"{where}: the hub holds it gated and {not_cached}; log in (`hf auth login`) with access to it, "
            f"or {_what_to_do(name, config_name)}"
        ) from None
    except RepositoryNotFoundError:
        raise HubDatasetError(
            f"{where}: the hub has no dataset of that name (or it is private) and {not_cached}; "
            "check the spelling, or the local path if one was meant"
        ) from None
    except Exception as e:  # noqa: BLE001 - no network, DNS, proxy, timeout: the hub is out of reach
        raise HubDatasetError(
            f"{where}: the hub is unreachable ({type(e).__name__}: {str(e)[:200]}; {_offline_setting()}) and "
            f"{not_cached}; {_what_to_do(name, config_name)}"
        ) from None
    try:
        return datasets.load_dataset(name, config)
    except Exception as e:  # noqa: BLE001 - a missing configuration, a file that fails to parse, a broken download
        hint = "; choose one with dataset.config_name" if "config" in str(e).lower() else ""
        raise HubDatasetError(f"{where}: loading it failed ({type(e).__name__}: {str(e)[:500]}){hint}") from None
