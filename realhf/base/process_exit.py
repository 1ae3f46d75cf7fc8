"""Ending a worker process once its own clean-up is done, without the interpreter's finalization.

A worker may leave a daemon thread blocked inside torch's C++ code: a gloo or TCPStore wait it
gave up on and left to run out its timeout (realhf.system.trainer.weight_broadcast abandons the
rendezvous of a weight group whose server died). If that timeout fires while the interpreter is
finalizing (tearing down modules and collecting the trainer's model takes a second or more), the
thread cannot take the GIL back and is ended with pthread_exit, whose forced unwind through a
C++ noexcept frame calls std::terminate: a worker that had finished with code 0 dies of SIGABRT
("terminate called without an active exception"). So `exit_now` does what finalization would
have done that matters (atexit handlers: name_resolve's connections, multiprocessing's children;
the other threads' work; the logs and standard streams) and ends the process with `os._exit`. The command-line entry points end the same way (`run_then_exit`):
their process holds daemon threads too (the evaluation's engine, a library's import in the
background), and a failed run once ended in SIGABRT instead of its exit 1.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import traceback
from typing import Callable, Optional

THREADS_JOIN_S = 10.0  # how long the process waits for its non-daemon threads, all together


def exit_now(code: int, threads_join_s: float = THREADS_JOIN_S) -> None:
    """End the process with `code`: join the non-daemon threads (at most `threads_join_s`
    together, as the interpreter would without a bound), run the atexit handlers, flush the
    logs and standard streams, then `os._exit`. Never returns."""
    deadline = time.monotonic() + threads_join_s
    for t in threading.enumerate():
        if t is threading.current_thread() or t.daemon:
            continue
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            print(
                f"exit: thread {t.name!r} still running after {threads_join_s:g}s; exiting without it",
                file=sys.stderr,
            )
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or its reader is gone
                pass
        os._exit(code)


def run_then_exit(main: Callable[[], Optional[int]]) -> None:
    """`exit_now` with the code of `main()`, read as the interpreter reads it: what it returns
    or its SystemExit carries (None is 0; anything but an int is printed, and 1); an exception
    that escapes is printed with its traceback, and 1 (a KeyboardInterrupt: 130, as a shell
    reports a process ended by Ctrl-C)."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter would, without its finalization
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    exit_now(code)
