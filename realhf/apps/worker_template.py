"""The worker template: a process that forks the local launcher's workers from itself
(`cluster.fork_workers`), having imported each built-in worker type's modules once, before the
first worker of that type.

Why: a worker started as a fresh `python -m realhf.apps.remote` first imports torch,
transformers and its own modules — the trainer ≈ 3 CPU-s, the generation server ≈ 2.5 — and a
trial starts five or more at once. On a small machine they queue for the cores and the run
waits for the slowest. Forked from here, a worker has all of that in memory (copy-on-write) and
goes straight to its configure step; a restarted worker comes back as fast. A worker type that
needs none of it (a user's own class) pays nothing for it: nothing is imported for it here.

Fork safety: the template starts no thread (the launcher gives it DEFAULT_WORKER_ENV, so BLAS
and OpenMP pools stay at one thread and are not started by an import), never initialises CUDA
(imports do not; `_fork` refuses once something did), and holds no socket but its channel to the
launcher, which every child closes. The child then does what `subprocess.Popen` did for a fresh
worker: a session of its own, SIGKILL when its parent (this template) dies, stdin from
/dev/null, stdout and stderr appended to its log, its own environment and working directory,
and its command line (`set_command_line`, over the room the template's own was started with) as
a fresh worker's would read, so `ps` and tools that look for a worker's config path see no
difference.

Channel (a socket pair with the launcher, its fd the first argument; msgpack maps, never pickle):
    launcher -> template  {"op": "fork", "id", "worker_type", "config", "log", "banner", "env", "cwd",
                           "python"}
    template -> launcher  {"op": "ready", "import_s"} once, then {"op": "forked", "id", "pid",
                          "warm_s": seconds spent importing for this worker type first} or
                          {"op": "refused", "id", "error"}, and {"op": "exited", "pid", "code"}
                          for every child it reaps (code as Popen's returncode: -N for signal N).
The template exits when the launcher closes the channel (or dies: PR_SET_PDEATHSIG), killing
what is left of its children first.

    python -m realhf.apps.worker_template FD LOG_DIR ROOM
        FD: its end of the channel; LOG_DIR: the trial's (shown in its title); ROOM: spaces that make
        room for a worker's command line
"""

import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
import traceback

import msgpack

from realhf.base.process import die_with_parent, set_command_line

# Imported before the first fork: what every worker imports (its entry point, the config loading).
BASE_MODULES = ("realhf.apps.remote",)


def _import(names) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - a worker that needs it imports it again and says why
            print(f"worker template: importing {name} failed ({type(e).__name__}: {e}); workers import it themselves")


def _warm(worker_type: str, warmed: set) -> float:
    """Before the first fork of a built-in worker type: import its module and what its configure
    step imports (`Worker.warm_modules`: torch, transformers' model code, the engines). A worker
    class of the user's is not imported here (its module might start threads at import): its
    workers import it themselves. The seconds it took (0 when already done)."""
    from realhf.system import WORKER_CLASSES

    if worker_type in warmed or worker_type not in WORKER_CLASSES:
        return 0.0
    warmed.add(worker_type)
    t = time.monotonic()
    module, name = WORKER_CLASSES[worker_type].split(":")
    _import([module])
    _import(getattr(getattr(sys.modules.get(module), name, None), "warm_modules", ()))
    # What the imports created is never collected in a child: without this, a child's first full
    # collection writes to every object's header and copies the whole inherited heap.
    gc.freeze()
    return time.monotonic() - t


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _child(request: dict, channel: socket.socket, wakeup: tuple) -> None:
    """In the forked child: become the worker a fresh `python -m realhf.apps.remote` would be."""
    code = 1
    try:
        os.setsid()
        die_with_parent()
        if os.getppid() == 1:  # the template died before PDEATHSIG was armed
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        channel.close()
        for fd in wakeup:
            os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if request.get("banner"):
            os.write(log, request["banner"].encode())
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        argv = ["worker", "--config", request["config"]]
        set_command_line([request["python"], "-m", "realhf.apps.remote", *argv])
        sys.argv = ["-m", *argv]
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # forked children would otherwise share one global RandomState
            numpy.random.seed()
        from realhf.apps.remote import main

        code = main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
        traceback.print_exc()
        code = 1
    from realhf.base.process_exit import exit_now

    exit_now(code)


def _fork(request: dict, channel: socket.socket, wakeup: tuple, warmed: set) -> dict:
    warm_s = _warm(request["worker_type"], warmed)
    if _cuda_initialised():
        return {"op": "refused", "id": request["id"], "error": "CUDA was initialised in the template"}
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, channel, wakeup)  # never returns
    return {"op": "forked", "id": request["id"], "pid": pid, "warm_s": round(warm_s, 3)}


def _reap(children: set) -> list:
    exits = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        children.discard(pid)
        exits.append({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
    return exits


def serve(channel: socket.socket) -> None:
    # SIGCHLD wakes the loop through a pipe (signal.set_wakeup_fd): exits are reported at once.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    send = lambda msg: channel.sendall(msgpack.packb(msg))  # noqa: E731
    t = time.monotonic()
    _import(BASE_MODULES)
    gc.freeze()
    send({"op": "ready", "import_s": round(time.monotonic() - t, 3)})
    unpacker = msgpack.Unpacker(raw=False)
    children: set = set()
    warmed: set = set()
    try:
        while True:
            readable, _, _ = select.select([channel, wake_r], [], [], 1.0)
            if wake_r in readable:
                os.read(wake_r, 4096)
            if channel in readable:
                data = channel.recv(1 << 16)
                if not data:
                    return  # the launcher closed the channel: the run is over
                unpacker.feed(data)
                for request in unpacker:
                    reply = _fork(request, channel, (wake_r, wake_w), warmed)
                    if reply["op"] == "forked":
                        children.add(reply["pid"])
                    send(reply)
            for exit_report in _reap(children):
                send(exit_report)
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        for pid in children:  # the launcher stops its workers first; this is only what escaped it
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def main() -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    channel = socket.socket(fileno=int(sys.argv[1]))
    set_command_line([sys.executable, "-m", "realhf.apps.worker_template", *sys.argv[1:3]])
    serve(channel)
    sys.stdout.flush()
    os._exit(0)  # nothing to finalize: tearing down its modules would only delay the launcher's exit


if __name__ == "__main__":
    main()
