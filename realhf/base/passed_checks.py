"""A record of checks that passed, so that the same check of the same inputs is not run again.

A check is named by a key that digests everything its outcome depends on (the inputs' contents,
the checking code, the library versions): with the same key the answer cannot differ. Only
passes are recorded; a check that fails runs, and says why, every time. The record lives in
realhf's private cache directory (realhf.base.user_cache); a record that cannot be written or
read is only a check run again."""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Iterable, Optional, Union

from realhf.base.user_cache import private_cache_dir


class KeyDigest:
    """The key of one check: feed it every input (`add`) and every file (`add_file`)."""

    def __init__(self, kind: str):
        self._h = hashlib.sha256(kind.encode())

    def add(self, *parts: Union[str, bytes, int, float, None]) -> "KeyDigest":
        for p in parts:
            data = p if isinstance(p, bytes) else repr(p).encode("utf-8", "surrogatepass")
            self._h.update(len(data).to_bytes(8, "little"))  # length-prefixed: ("ab","c") != ("a","bc")
            self._h.update(data)
        return self

    def add_file(self, path: str, max_content_bytes: int = 64 * 2**20) -> "KeyDigest":
        """Its name and contents (a file over `max_content_bytes`: its size and mtime)."""
        st = os.stat(path)
        self.add(os.path.basename(path), st.st_size)
        if st.st_size > max_content_bytes:
            return self.add(st.st_mtime_ns)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                self._h.update(block)
        return self

    def add_files(self, paths: Iterable[str]) -> "KeyDigest":
        for p in sorted(paths):
            self.add_file(p)
        return self

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class PassedChecks:
    """Passed checks of one kind, one file per key under the private cache directory: empty, or
    holding what the check found (`record(key, value)`, read back by `value(key)`)."""

    def __init__(self, kind: str, directory: str = ""):
        self.dir = directory or private_cache_dir("passed-checks")
        self.kind = kind

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, f"{self.kind}-{key}")

    def passed(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def value(self, key: str) -> Optional[str]:
        """What was recorded with `key`, None if nothing was (or it cannot be read)."""
        try:
            with open(self._path(key), encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    def record(self, key: str, value: str = "") -> None:
        try:
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(value)
            os.replace(tmp, self._path(key))
        except OSError:
            pass  # not recorded: the check runs again next time
