"""Where realhf's own files are, whatever the working directory: the experiment configs
(training/configs/*.yaml) and the default task's assets (assets/tiny-math: prompts and the
warm-started model). In a source checkout, and an editable install of it, they are the
checkout's; an installed wheel carries copies under realhf/_bundled (setup.py puts them there).
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../realhf
_CHECKOUT = os.path.dirname(PACKAGE_DIR)
BUNDLED_DIR = os.path.join(PACKAGE_DIR, "_bundled")
# The relative paths the configs name that a run started anywhere may take from the package.
PACKAGED_PREFIXES = ("assets/",)


def files_root() -> str:
    """The directory holding training/configs and assets/: the checkout's, else the wheel's copy."""
    if os.path.isdir(os.path.join(_CHECKOUT, "training", "configs")):
        return _CHECKOUT
    return BUNDLED_DIR


CONFIG_DIR = os.path.join(files_root(), "training", "configs")


def packaged_path(path: str) -> str:
    """`path` itself, unless it is a relative path under PACKAGED_PREFIXES that does not exist from
    the working directory but does in realhf's files: then that absolute path (so the default
    config runs from any directory; a file of the user's of the same name wins)."""
    if not path or os.path.isabs(path) or os.path.exists(path):
        return path
    if not os.path.normpath(path).replace(os.sep, "/").startswith(PACKAGED_PREFIXES):
        return path
    candidate = os.path.join(files_root(), path)
    return candidate if os.path.exists(candidate) else path
