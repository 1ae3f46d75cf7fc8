"""One logging setup for every realhf process.

Workers log to stderr, which the local launcher redirects into one file per worker; the format
carries the worker name so interleaved console output stays readable.
"""

import logging
import sys

_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(name)s: %(message)s"
_DATEFMT = "%H:%M:%S"
_configured = False


def setup(level: str = "INFO", prefix: str = "") -> None:
    """Configure the root logger once per process."""
    global _configured
    fmt = f"{prefix} {_FORMAT}" if prefix else _FORMAT
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt, datefmt=_DATEFMT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    # A dictConfig since the first setup (Hydra's, at start-up) disabled every logger that existed.
    for existing in logging.root.manager.loggerDict.values():
        if isinstance(existing, logging.Logger):
            existing.disabled = False
    # Third-party libraries are chatty at INFO; their warnings still come through.
    for noisy in ("httpx", "urllib3", "asyncio", "uvicorn.access", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _configured = True


def getLogger(name: str) -> logging.Logger:
    if not _configured:
        setup()
    return logging.getLogger(name)
