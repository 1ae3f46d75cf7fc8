"""The worker template: a process that forks the local launcher's workers from itself
(`cluster.fork_workers`), having imported each built-in worker type's modules once, before the
first worker of that type.

Why: a worker started as a fresh `python -m realhf.apps.remote` first imports torch,
transformers and its own modules — the trainer ≈ 3 CPU-s, the generation server ≈ 2.5 — and a
trial starts five or more at once. On a small machine they queue for the cores and the run
waits for the slowest. Forked from here, a worker has all of that in memory (copy-on-write) and
goes straight to its configure step; a restarted worker comes back as fast. A worker type that
needs none of it (a user's own class) pays nothing for it: nothing is imported for it here.

Shared (`--listen PATH`): one template on a Unix socket serves every launch that names it
(`cluster.worker_template`), so the imports are paid once per machine, not once per launch: a
2-step run of the embedded default takes ≈ 3.4 s instead of ≈ 7 on 2 cores (docs/benchmarks.md).
It forks for a launch only when that launch's Python and realhf, and the environment variables an
interpreter reads as it starts or imports torch and transformers (`start_env`), are its own, and
no realhf module it imported changed since it started; otherwise it refuses and the launcher
starts a template of its own. The workers are then the shared template's children, not the
launcher's: when a launcher's connection closes (it ended, or died) the template SIGKILLs what is
left of that launcher's workers, and the launcher's watchdog sweeps their process groups too.

Fork safety: the template starts no thread (the launcher gives it DEFAULT_WORKER_ENV, so BLAS
and OpenMP pools stay at one thread and are not started by an import), never initialises CUDA
(imports do not; `_fork` refuses once something did), and holds no socket but its channels to
launchers (and its listening socket), which every child closes. The child then does what
`subprocess.Popen` did for a fresh worker: a session of its own, SIGKILL when its parent (this
template) dies, stdin from /dev/null, stdout and stderr appended to its log, its own environment,
working directory and `sys.path[0]`, and its command line (`set_command_line`, over the room the
template's own was started with) as a fresh worker's would read, so `ps` and tools that look for a
worker's config path see no difference.

Channel (a socket pair with the launcher that started it, its fd the first argument; or a
connection to the shared socket; msgpack maps, never pickle):
    launcher -> template  {"op": "hello", "python", "package", "env"} first, on a shared template only;
                          {"op": "fork", "id", "worker_type", "config", "log", "banner", "env", "cwd",
                           "python"}
    template -> launcher  {"op": "ready", "pid", "import_s"} once (on a shared template: or
                          {"op": "refused", "id": 0, "error"}), then {"op": "forked", "id", "pid",
                          "warm_s": seconds spent importing for this worker type first} or
                          {"op": "refused", "id", "error"}, and {"op": "exited", "pid", "code"}
                          for every child it reaps (code as Popen's returncode: -N for signal N).
A launch's own template exits when its launcher closes the channel (or dies: PR_SET_PDEATHSIG),
killing what is left of its children first; a shared one on SIGTERM or SIGINT.

    python -m realhf.apps.worker_template FD LOG_DIR ROOM
        FD: its end of the channel; LOG_DIR: the trial's (shown in its title); ROOM: spaces that make
        room for a worker's command line
    python -m realhf.apps.worker_template --listen PATH
        a shared template on the Unix socket PATH (created for this user only)
"""

import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
from typing import Dict, Optional

import msgpack

from realhf.base.process import die_with_parent, set_command_line
from realhf.base.process_exit import run_then_exit

# Imported before the first fork: what every worker imports (its entry point, the config loading).
BASE_MODULES = ("realhf.apps.remote",)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # realhf/
_START_CWD = os.getcwd()


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


def _child(request: dict, template_fds: list) -> None:
    """In the forked child: become the worker a fresh `python -m realhf.apps.remote` would be, and
    end as it ends (its code, or the traceback and 1), without the interpreter's finalization."""
    run_then_exit(lambda: _become_worker(request, template_fds))


def _become_worker(request: dict, template_fds: list) -> int:
    os.setsid()
    die_with_parent()
    if os.getppid() == 1:  # the template died before PDEATHSIG was armed
        os._exit(1)
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in template_fds:  # its channels, listening socket and wake-up pipe are not the worker's
        try:
            os.close(fd)
        except OSError:
            pass
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
    if sys.path and sys.path[0] == _START_CWD:  # `-m` put the template's cwd first: a fresh worker's is its own
        sys.path[0] = request["cwd"]
    os.chdir(request["cwd"])
    argv = ["worker", "--config", request["config"]]
    set_command_line([request["python"], "-m", "realhf.apps.remote", *argv])
    sys.argv = ["-m", *argv]
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # forked children would otherwise share one global RandomState
        numpy.random.seed()
    from realhf.apps.remote import main

    return main(argv)


# What a process reads from its environment as it starts or imports torch and transformers: a
# launch whose values differ cannot use a shared template's imports (its workers would not be
# what a fresh interpreter of that environment makes).
_START_ENV_PREFIXES = (
    "PYTHON", "LD_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "GOMP_", "TORCH", "PYTORCH_", "ATEN_", "ONEDNN_", "DNNL_",
    "NPY_", "HF_", "TRANSFORMERS_", "CUDA_",
)  # fmt: skip


def start_env(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_START_ENV_PREFIXES)}


class _Launcher:
    """One launcher's connection: its requests, the workers forked for it."""

    def __init__(self, sock: socket.socket, greeted: bool):
        self.sock, self.greeted = sock, greeted
        self.unpacker = msgpack.Unpacker(raw=False)
        self.children: set = set()

    def send(self, msg: dict) -> None:
        self.sock.sendall(msgpack.packb(msg))


class Template:
    """The fork loop. With `channel` (a socket pair with the launcher that started it) it serves
    that launcher until it closes the channel; with `listener` (a Unix socket, shared) it serves
    every launcher that connects and greets it, until SIGTERM or SIGINT. Either way, a launcher
    that goes (closes, dies) takes whatever is left of its workers with it."""

    def __init__(self, channel: Optional[socket.socket] = None, listener: Optional[socket.socket] = None):
        self.channel, self.listener = channel, listener
        self.launchers: Dict[int, _Launcher] = {}  # by socket fd
        self.owner: Dict[int, Optional[_Launcher]] = {}  # forked pid -> its launcher (None: gone)
        self.warmed: set = set()
        self.started = time.time()
        self.import_s = 0.0
        self.env = start_env(os.environ)

    def _fds(self) -> list:
        fds = [self.wake_r, self.wake_w] + list(self.launchers)
        return fds + ([self.listener.fileno()] if self.listener is not None else [])

    def _stale(self) -> str:
        """Why this template's code is no longer what a fresh worker would import (empty: it is)."""
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None) or ""
            if path.startswith(_PACKAGE_DIR):
                try:
                    if os.stat(path).st_mtime > self.started:
                        return f"{path} changed since the template started (restart it)"
                except OSError:
                    return f"{path} is gone since the template started (restart it)"
        return ""

    def _greet(self, launcher: _Launcher, hello: dict) -> None:
        """A launcher's first message on a shared template: may its workers fork from here?"""
        why = ""
        if hello.get("python") != sys.executable:
            why = f"the launch runs {hello.get('python')}, the template {sys.executable}"
        elif hello.get("package") != _PACKAGE_DIR:
            why = f"the launch runs realhf from {hello.get('package')}, the template from {_PACKAGE_DIR}"
        elif start_env(hello.get("env", {})) != self.env:
            theirs = start_env(hello.get("env", {}))
            names = sorted(k for k in set(theirs) | set(self.env) if theirs.get(k) != self.env.get(k))
            why = f"the launch's environment differs in {', '.join(names)}, read as an interpreter starts"
        else:
            why = self._stale()
        if why:
            launcher.send({"op": "refused", "id": 0, "error": why})
        else:
            launcher.greeted = True
            launcher.send({"op": "ready", "pid": os.getpid(), "import_s": round(self.import_s, 3)})

    def _fork(self, request: dict) -> dict:
        warm_s = _warm(request["worker_type"], self.warmed)
        if _cuda_initialised():
            return {"op": "refused", "id": request["id"], "error": "CUDA was initialised in the template"}
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, self._fds())  # never returns
        return {"op": "forked", "id": request["id"], "pid": pid, "warm_s": round(warm_s, 3)}

    def _handle(self, launcher: _Launcher, request: dict) -> None:
        if request.get("op") == "hello":
            self._greet(launcher, request)
        elif not launcher.greeted:
            launcher.send({"op": "refused", "id": request.get("id", 0), "error": "no hello before the fork"})
        else:
            reply = self._fork(request)
            if reply["op"] == "forked":
                launcher.children.add(reply["pid"])
                self.owner[reply["pid"]] = launcher
            launcher.send(reply)

    def _drop(self, launcher: _Launcher) -> None:
        """The launcher is gone: what is left of its workers goes with it, as with PDEATHSIG."""
        self.launchers.pop(launcher.sock.fileno(), None)
        for pid in launcher.children:
            self.owner[pid] = None
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        launcher.children.clear()
        launcher.sock.close()

    def _reap(self) -> None:
        while self.owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            launcher = self.owner.pop(pid, None)
            if launcher is not None and launcher.sock.fileno() in self.launchers:
                launcher.children.discard(pid)
                try:
                    launcher.send({"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})
                except OSError:
                    self._drop(launcher)

    def serve(self) -> None:
        # SIGCHLD wakes the loop through a pipe (signal.set_wakeup_fd): exits are reported at once.
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        t = time.monotonic()
        _import(BASE_MODULES)
        gc.freeze()
        self.import_s = time.monotonic() - t
        if self.channel is not None:
            launcher = self.launchers[self.channel.fileno()] = _Launcher(self.channel, greeted=True)
            launcher.send({"op": "ready", "pid": os.getpid(), "import_s": round(self.import_s, 3)})
        try:
            while self.channel is None or self.channel.fileno() != -1:  # a launch's own: until its channel closes
                socks = [lc.sock for lc in self.launchers.values()]
                listening = [self.listener] if self.listener is not None else []
                readable, _, _ = select.select([self.wake_r, *listening, *socks], [], [], 1.0)
                if self.wake_r in readable:
                    os.read(self.wake_r, 4096)
                if self.listener is not None and self.listener in readable:
                    sock, _ = self.listener.accept()
                    self.launchers[sock.fileno()] = _Launcher(sock, greeted=False)
                for sock in socks:
                    if sock not in readable or sock.fileno() not in self.launchers:
                        continue
                    launcher = self.launchers[sock.fileno()]
                    try:
                        data = sock.recv(1 << 16)
                        launcher.unpacker.feed(data)
                        for request in launcher.unpacker if data else ():
                            self._handle(launcher, request)
                    except OSError:
                        data = b""
                    if not data:
                        self._drop(launcher)
                        if launcher.sock is self.channel:
                            return  # the launcher that started it closed the channel: the run is over
                self._reap()
        finally:
            for launcher in list(self.launchers.values()):
                self._drop(launcher)


def _listen(path: str) -> socket.socket:
    """A Unix socket at `path` only this user can connect to (a connection may ask for any
    environment and working directory: it runs code as this user)."""
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            raise SystemExit(f"worker template: another template already listens on {path}")
        except (ConnectionRefusedError, FileNotFoundError):
            os.unlink(path)  # a template that died left it
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    except OSError as e:  # e.g. a path over the 107 bytes a Unix socket's address holds
        raise SystemExit(f"worker template: cannot listen on {path} ({e})") from None
    finally:
        os.umask(old)
    listener.listen(64)
    return listener


def _stop(signum, _frame):
    raise SystemExit(128 + signum)


def main() -> None:
    if sys.argv[1:2] == ["--listen"]:
        path = os.path.abspath(sys.argv[2])
        if len(sys.argv) < 4:  # room for the workers' command lines: start again with it
            from realhf.scheduler.worker_spec import DEFAULT_WORKER_ENV
            from realhf.scheduler.worker_template import TITLE_ROOM

            # ... and with the environment a launcher gives its workers (one BLAS/OpenMP thread):
            # what a launch's hello is compared with.
            os.environ.update(DEFAULT_WORKER_ENV)
            os.execv(
                sys.executable,
                [sys.executable, "-m", "realhf.apps.worker_template", "--listen", path, " " * TITLE_ROOM],
            )
        set_command_line([sys.executable, "-m", "realhf.apps.worker_template", "--listen", path])
        listener = _listen(path)
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        print(f"worker template (pid {os.getpid()}) listening on {path}", flush=True)
        try:
            Template(listener=listener).serve()
        finally:
            listener.close()
            if os.path.exists(path):
                os.unlink(path)
        return
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    channel = socket.socket(fileno=int(sys.argv[1]))
    set_command_line([sys.executable, "-m", "realhf.apps.worker_template", *sys.argv[1:3]])
    Template(channel=channel).serve()
    sys.stdout.flush()
    os._exit(0)  # nothing to finalize: tearing down its modules would only delay the launcher's exit


if __name__ == "__main__":
    main()
