"""Prompt data stored as tables: a `.parquet` file, or a directory written by HF `datasets`'
`save_to_disk` (one `Dataset`, or a `DatasetDict` of named splits).

Both are read with the `datasets` library, imported only here and only when such a path is
configured, so the default JSONL run does not need it (`pip install 'realhf[datasets]'`). A
table's rows come out as plain Python dicts with their 0-based row index (what `Dataset[i]`
returns), which is the row number a bad row is reported with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple, Union


class DatasetFormatError(ValueError):
    """A dataset row that does not follow the prompt schema; the message is `where: what`
    (raised here and by realhf.impl.dataset.prompt_dataset, which reads every format)."""


EXTRA_HINT = "pip install 'realhf[datasets]'"


def is_table_path(path: Union[str, Path]) -> bool:
    """True for the formats this module reads (JSONL is anything else)."""
    return os.path.isdir(path) or str(path).endswith(".parquet")


def _datasets(path: Union[str, Path]):
    try:
        import datasets
    except ImportError:
        raise ImportError(f"reading {path} needs the datasets library: {EXTRA_HINT}") from None
    return datasets


def open_table(path: Union[str, Path], split: str) -> Tuple[Any, str]:
    """(the `datasets.Dataset`, a label naming the file and, for a DatasetDict, the split).
    A DatasetFormatError for what is not a readable table."""
    datasets = _datasets(path)
    if not os.path.isdir(path):
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
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DatasetFormatError(
                f"{path}: the DatasetDict has no split {split!r} (its splits: "
                f"{', '.join(loaded)}); choose one with dataset.split / dataset.test_split"
            )
        return loaded[split], f"{path} split {split!r}"
    return loaded, str(path)


def table_rows(table: Any) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """(row index, row) for every row of a `datasets.Dataset`. A null cell is left out of its
    row: it is how a table spells a field that a JSONL row would simply not have."""
    for index, row in enumerate(table):
        yield index, {k: v for k, v in row.items() if v is not None}
