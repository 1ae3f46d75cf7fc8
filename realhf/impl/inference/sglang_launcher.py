"""The `sglang` backend: run `python -m sglang.launch_server` as a child process.

sglang itself is never imported here (it is a GPU-cluster dependency, absent in CI); the child
process imports it. `build_sglang_command` is a pure function of the config, and `SGLangProcess`
owns the process: its own session (so the whole tree can be killed), PR_SET_PDEATHSIG (so it dies
with us), a log file, a `/health` wait with a timeout whose error names the URL and shows the log
tail, and a tree kill on stop.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Dict, List, Optional

from realhf.api.cli_args import SGLangConfig
from realhf.base import logging
from realhf.base.process import die_with_parent, kill_process_trees

logger = logging.getLogger("sglang_launcher")


class SGLangLaunchError(RuntimeError):
    pass


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def build_sglang_command(
    model_path: str,
    host: str,
    port: int,
    config: SGLangConfig,
    *,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    gpu_share: float = 1.0,
    seed: int = 1,
    python: str = sys.executable,
    api_key_file: str = "",
) -> List[str]:
    """The `python -m sglang.launch_server ...` argv. Optional SGLang fields are passed only when
    set away from their "SGLang's default" value, so SGLang keeps choosing them itself. With
    `api_key_file` (the run's secret, in an owner-only file) the server requires the key, handed
    over by `realhf.impl.inference.sglang_entry` so that it is on no command line. `gpu_share`
    is the server's part of GPUs it shares with a trainer rank (realhf.base.placement):
    `config.mem_fraction_static` is a fraction of a whole GPU, so SGLang gets that much of its
    share, and its activations stay inside the share too."""
    if not model_path:
        raise ValueError("sglang backend: model_path is empty")
    if tp_size < 1:
        raise ValueError(f"sglang backend: tp_size must be >= 1, got {tp_size}")
    if base_gpu_id < 0:
        raise ValueError(f"sglang backend: base_gpu_id must be >= 0, got {base_gpu_id}")
    if not 0 < gpu_share <= 1:
        raise ValueError(f"sglang backend: gpu_share must lie in (0, 1], got {gpu_share}")
    entry = (
        ["realhf.impl.inference.sglang_entry", "--api-key-file", api_key_file]
        if api_key_file
        else ["sglang.launch_server"]
    )
    cmd = [
        python,
        "-m",
        *entry,
        "--model-path",
        model_path,
        "--skip-tokenizer-init",
        "--tp-size",
        str(tp_size),
        "--base-gpu-id",
        str(base_gpu_id),
        "--random-seed",
        str(seed),
        "--host",
        host,
        "--port",
        str(port),
        "--mem-fraction-static",
        f"{config.mem_fraction_static * gpu_share:.6g}",
        "--dtype",
        config.dtype,
        "--kv-cache-dtype",
        config.kv_cache_dtype,
        "--log-level",
        config.log_level,
    ]
    if config.context_length > 0:
        cmd += ["--context-length", str(config.context_length)]
    if config.max_running_requests > 0:
        cmd += ["--max-running-requests", str(config.max_running_requests)]
    if config.chunked_prefill_size != -1:
        cmd += ["--chunked-prefill-size", str(config.chunked_prefill_size)]
    if config.attention_backend:
        cmd += ["--attention-backend", config.attention_backend]
    if config.enable_metrics:
        cmd.append("--enable-metrics")
    if config.disable_radix_cache:
        cmd.append("--disable-radix-cache")
    cmd += [str(a) for a in config.extra_args]
    return cmd


def _log_tail(path: str, n_lines: int = 30) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 32 * 1024))
            return "\n".join(f.read().decode(errors="replace").splitlines()[-n_lines:])
    except OSError as e:
        return f"(cannot read {path}: {e})"


def http_healthy(url: str, timeout: float, headers: Optional[Dict[str, str]] = None) -> bool:
    try:
        request = urllib.request.Request(f"{url}/health", headers=headers or {})
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class SGLangProcess:
    """A generation server in a child process, healthy once `start()` returns."""

    def __init__(
        self,
        command: List[str],
        url: str,
        log_path: str,
        startup_timeout: float = 600.0,
        health_timeout: float = 5.0,
        env: Optional[Dict[str, str]] = None,
        poll_interval: float = 0.5,
        headers: Optional[Dict[str, str]] = None,
    ):
        self.command, self.url, self.log_path = command, url, log_path
        self.headers = headers or {}  # the run's Authorization header
        self.startup_timeout, self.health_timeout, self.poll_interval = startup_timeout, health_timeout, poll_interval
        self.env = env
        self.popen: Optional[subprocess.Popen] = None
        self._log = None

    def start(self) -> "SGLangProcess":
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        self._log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.update(self.env or {})
        logger.info(f"starting {self.url}: {' '.join(self.command)} (log: {self.log_path})")
        self.popen = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout
        while True:
            code = self.popen.poll()
            if code is not None:
                raise SGLangLaunchError(
                    f"generation server {self.url} exited with code {code} before /health answered; "
                    f"last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            if http_healthy(self.url, self.health_timeout, self.headers):
                logger.info(f"{self.url} healthy after {time.monotonic() - t0:.1f}s (pid {self.popen.pid})")
                return
            if time.monotonic() > deadline:
                raise SGLangLaunchError(
                    f"timed out after {self.startup_timeout:.0f}s waiting for {self.url}/health "
                    f"(pid {self.popen.pid}); last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
                )
            time.sleep(self.poll_interval)

    def exit_code(self) -> Optional[int]:
        return None if self.popen is None else self.popen.poll()

    def log_tail(self, n_lines: int = 30) -> str:
        return _log_tail(self.log_path, n_lines)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the whole process tree, SIGKILL what is left after `timeout`. Idempotent."""
        if self.popen is not None:
            left = kill_process_trees([self.popen.pid], timeout=timeout)
            if left:
                logger.error(f"{self.url}: could not kill pids {[p.pid for p in left]}")
            try:  # children whose parent already died are no longer in its tree, but in its group
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
