"""Prompt data stored as tables: a `.parquet` file, a directory written by HF `datasets`'
`save_to_disk` (one `Dataset`, or a `DatasetDict` of named splits), a folder of data files
(jsonl/json/csv/parquet, split by file name as `datasets.load_dataset(folder)` splits them:
train.jsonl / test.jsonl, data/train-*.parquet, ...) or a Hugging Face hub dataset name
(`owner/name`, realhf.impl.dataset.hub_source).

All are read with the `datasets` library, imported only here and only when such a path is
configured, so the default JSONL run does not need it (`pip install 'realhf[datasets]'`). A
table's rows come out as plain Python dicts with their 0-based row index (what `Dataset[i]`
returns), which is the row number a bad row is reported with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Union

from realhf.impl.dataset.hub_source import HubDatasetError, load_hub_dataset, looks_like_hub_name


class DatasetFormatError(ValueError):
    """A dataset row that does not follow the prompt schema; the message is `where: what`
    (raised here and by realhf.impl.dataset.prompt_dataset, which reads every format)."""


EXTRA_HINT = "pip install 'realhf[datasets]'"


# What save_to_disk writes at the top of its directory (a DatasetDict, or one Dataset); a folder
# without either is a folder of data files.
_SAVED_MARKERS = ("dataset_dict.json", "state.json")


def source_kind(path: Union[str, Path]) -> str:
    """What `path` is: "jsonl" (any other file), "parquet", "saved" (a save_to_disk directory),
    "folder" (of data files) or "hub" (a hub dataset name); a DatasetFormatError when it is none."""
    path = str(path)
    if os.path.isfile(path):
        return "parquet" if path.endswith(".parquet") else "jsonl"
    if os.path.isdir(path):
        return "saved" if any(os.path.isfile(os.path.join(path, m)) for m in _SAVED_MARKERS) else "folder"
    if looks_like_hub_name(path):
        return "hub"
    raise DatasetFormatError(
        f"{path}: no such file or directory (relative paths are from {os.getcwd()}); a Hugging Face dataset "
        "is named owner/name"
    )


def is_table_path(path: Union[str, Path]) -> bool:
    """True for the formats this module reads (JSONL is anything else)."""
    return source_kind(path) != "jsonl"


def _datasets(path: Union[str, Path]):
    try:
        import datasets
    except ImportError:
        raise ImportError(f"reading {path} needs the datasets library: {EXTRA_HINT}") from None
    return datasets


def open_table(path: Union[str, Path], split: str, config_name: str = "") -> Tuple[Any, str]:
    """(the `datasets.Dataset`, a label naming the file and, for a DatasetDict, the split).
    `config_name`: the configuration of a hub dataset. A DatasetFormatError for what is not a
    readable table."""
    kind = source_kind(path)
    datasets = _datasets(path)
    if kind == "hub":
        try:
            return _split(datasets, load_hub_dataset(datasets, str(path), config_name), path, split)
        except HubDatasetError as e:
            raise DatasetFormatError(str(e)) from None
    if kind == "folder":
        try:
            # Streamed: each process reads the files themselves, as a JSONL file is read, instead
            # of every worker preparing (or waiting on a lock for) a copy in the HF cache.
            loaded = datasets.load_dataset(str(path), streaming=True)
        except Exception as e:  # noqa: BLE001 - no data files, mixed formats, a file its builder cannot parse
            raise DatasetFormatError(
                f"{path}: neither a directory written by datasets' save_to_disk (it has no {' or '.join(_SAVED_MARKERS)}) "
                f"nor a folder of data files datasets.load_dataset can read ({type(e).__name__}: {str(e)[:500]})"
            ) from None
        return _split(datasets, loaded, path, split)
    if kind == "parquet":
        import pyarrow.parquet as pq

        try:
            # Not Dataset.from_parquet: its builder would copy the file into the HF cache in
            # every process that loads it; an in-memory table is all a prompt list needs.
            table = pq.read_table(path)
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise DatasetFormatError(f"{path}: not a readable parquet file ({e})") from None
        return datasets.Dataset(table), str(path)
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise DatasetFormatError(f"{path}: not a directory written by datasets' save_to_disk ({e})") from None
    return _split(datasets, loaded, path, split)


def _split(datasets: Any, loaded: Any, path: Union[str, Path], split: str) -> Tuple[Any, str]:
    if isinstance(loaded, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split not in loaded:
            raise DatasetFormatError(
                f"{path}: the dataset has no split {split!r} (its splits: "
                f"{', '.join(loaded)}); choose one with dataset.split / dataset.test_split"
            )
        return loaded[split], f"{path} split {split!r}"
    return loaded, str(path)


def table_rows(table: Any, label: str) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """(row index, row) for every row of a `datasets.Dataset` (or of a streamed folder's
    IterableDataset, whose files are parsed as they are read: a file that fails is named with the
    row it failed at). A null cell is left out of its row: it is how a table spells a field that
    a JSONL row would simply not have."""
    rows = iter(table)
    index = 0
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - a streamed file its builder cannot parse
            raise DatasetFormatError(
                f"{label} row {index}: the data files cannot be read from here on ({type(e).__name__}: {str(e)[:500]})"
            ) from None
        yield index, {k: v for k, v in row.items() if v is not None}
        index += 1


def table_len(table: Any, label: str) -> int:
    """Rows of a table (a streamed one is read through to count them)."""
    n = getattr(table, "num_rows", None)
    return n if n is not None else sum(1 for _ in table_rows(table, label))
