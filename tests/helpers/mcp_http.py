"""The test MCP server (helpers.mcp_server) over streamable HTTP on loopback, as a real subprocess:

with mcp_http_server(log=tmp_path / "calls") as (url, proc):
    ...  # url: http://127.0.0.1:PORT/mcp; each tool call appends a line to the log
"""

import contextlib
import os
import selectors
import subprocess
import sys
import tempfile
import time

from helpers.paths import REPO, TESTS_DIR


@contextlib.contextmanager
def mcp_http_server(log=None, token: str = "", timeout: float = 30.0):
    """Start the server, yield (url, process) once it printed its URL; kill it afterwards."""
    cmd = [sys.executable, "-m", "helpers.mcp_server", "--http"]
    cmd += ["--token", token] if token else []
    cmd += ["--log", str(log)] if log else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR]))
    # stderr to a file: a pipe nobody drains would block a server that logs each request
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, env=env, text=True, cwd=REPO)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            deadline = time.monotonic() + timeout
            # the URL line is all the server writes to stdout; it is ready once it printed it
            ready = sel.select(max(0.0, deadline - time.monotonic()))
        line = proc.stdout.readline() if ready else ""
        if not line.startswith("URL "):
            proc.kill()
            errors.seek(0)
            raise TimeoutError(
                f"the test MCP server did not print its URL within {timeout}s (exit code {proc.poll()}); "
                f"stderr: {errors.read()[-2000:]}"
            )
        yield line.split()[1], proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        errors.close()
