"""Which line of a user's code an error came from, and the error said in one line.

An exception from a user's agent, environment or reward function travels through realhf's
episode loop (and often through asyncio, a thread pool or a library the user called) before
anyone reports it. What the user needs is their own line: the innermost frame of the traceback
whose file is neither realhf's own package nor the standard library or an installed package.
`ErrorReport.of(exc)` keeps that line beside the exception's type and message; its
`fingerprint` (type, message, line) tells one deterministic error repeating from errors that
merely look alike, and its `site` (type, line) tells the place an error comes from.

Passing through the user's code is not being raised by it: an error realhf raises inside
`await gen()` (a server that stays unreachable) has the agent's line in its traceback too. So a
report also says whether the error was raised by the user's code (`by_user`): at that line, or in
a library it called, but not in realhf code it called.
"""

from __future__ import annotations

import dataclasses
import os
import site
import sysconfig
import traceback
from typing import Iterable, List, Optional, Tuple

REALHF_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
# How much of the traceback a report carries: it travels through name resolve to the launcher.
TRACEBACK_CHARS = 6000


def _library_dirs() -> Tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(site.getusersitepackages())
    return tuple(sorted(os.path.realpath(d) for d in dirs if d))


LIBRARY_DIRS = _library_dirs()


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + os.sep)


def is_user_file(filename: str, library_dirs: Iterable[str] = LIBRARY_DIRS, realhf_dir: str = REALHF_DIR) -> bool:
    """Whether a traceback's file is the user's: not realhf, not the standard library or an
    installed package, and a real file (not `<frozen ...>` or `<string>`)."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.realpath(filename)
    return not _under(path, realhf_dir) and not any(_under(path, d) for d in library_dirs)


def pick_user_frame(
    frames: Iterable[traceback.FrameSummary], realhf_dir: str = REALHF_DIR, **where
) -> Tuple[Optional[traceback.FrameSummary], bool]:
    """The innermost (last) frame whose file is the user's (`is_user_file`), or None; and whether
    the error was raised by the user's code: no frame of realhf lies inside that one."""
    found, by_user = None, False
    for frame in frames:
        if is_user_file(frame.filename, realhf_dir=realhf_dir, **where):
            found, by_user = frame, True
        elif found is not None and _under(os.path.realpath(frame.filename), realhf_dir):
            by_user = False  # the user's code called realhf, which raised
    return found, by_user


def _chain(exc: BaseException) -> List[BaseException]:
    """`exc`, then what it was raised from or while handling, outward to inward (no cycles)."""
    seen, out = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    return out


def user_frame(exc: BaseException) -> Tuple[Optional[traceback.FrameSummary], bool]:
    """The user's line an exception comes from and whether the user's code raised it
    (`pick_user_frame`): in its own traceback, else in the exceptions it was raised from (realhf
    may wrap a user's error: `raise X(...) from e`). An exception of the chain the user's code
    raised comes first."""
    passed = (None, False)
    for e in _chain(exc):
        frame, by_user = pick_user_frame(traceback.extract_tb(e.__traceback__))
        if by_user:
            return frame, True
        if frame is not None and passed[0] is None:
            passed = (frame, False)
    return passed


def show_path(filename: str) -> str:
    """A path as the user would type it: relative to the working directory when under it."""
    path = os.path.realpath(filename)
    cwd = os.path.realpath(os.getcwd())
    return os.path.relpath(path, cwd) if _under(path, cwd) else path


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """An exception as the user should see it: `KeyError: 'tgt' at my_agent.py:12 in run_episode`."""

    type: str
    message: str
    where: str = ""  # "path:line in function" of the user's frame; "" when none is the user's
    by_user: bool = False  # raised by the user's code, not by realhf code it called
    traceback: str = ""

    @classmethod
    def of(cls, exc: BaseException) -> "ErrorReport":
        frame, by_user = user_frame(exc)
        where = f"{show_path(frame.filename)}:{frame.lineno} in {frame.name}" if frame is not None else ""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(type(exc).__name__, str(exc), where, by_user, text[-TRACEBACK_CHARS:])

    @property
    def fingerprint(self) -> Tuple[str, str, str]:
        """Equal for the same error raised again at the same line (a deterministic error)."""
        return self.type, self.message, self.where

    @property
    def site(self) -> Tuple[str, str]:
        """Equal for errors of one type from one line, whatever their messages."""
        return self.type, self.where

    def one_line(self) -> str:
        if not self.where:
            return f"{self.type}: {self.message}"
        at = f"at {self.where}" if self.by_user else f"(raised in realhf, called from {self.where})"
        return f"{self.type}: {self.message} {at}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ErrorReport":
        return cls(
            str(d.get("type", "")),
            str(d.get("message", "")),
            str(d.get("where", "")),
            bool(d.get("by_user", False)),
            str(d.get("traceback", "")),
        )
