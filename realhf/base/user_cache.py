"""Where realhf keeps what it can rebuild: `$XDG_CACHE_HOME/realhf/<name>` (default
`~/.cache/realhf/<name>`), used only while it is private (ours, writable by nobody else), since
what is found there is trusted (a compiled kernel is loaded, a recorded check is not rerun);
otherwise a private directory under the temp dir, or a fresh one for this process alone."""

from __future__ import annotations

import os
import tempfile


def is_private_dir(path: str) -> bool:
    """`path` (made if missing) is ours and writable by nobody else."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022 and os.access(path, os.W_OK)


def private_cache_dir(name: str) -> str:
    """The private cache directory for `name` (e.g. "kernels")."""
    user_cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    for d in (
        os.path.join(user_cache, "realhf", name),
        os.path.join(tempfile.gettempdir(), f"realhf-{name}-{os.getuid()}"),
    ):
        if is_private_dir(d):
            return d
    return tempfile.mkdtemp(prefix=f"realhf-{name}-")  # fresh and private: nothing found, nothing shared
