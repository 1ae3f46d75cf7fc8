"""ServerProcess against real child processes: a server SIGKILLed from outside leaves its own
children (vLLM's engine core, say) as orphans outside its process tree; stopping the
ServerProcess still kills them, found by the session the server led."""

import os
import signal
import sys
import textwrap

import psutil
import pytest

from realhf.base.network import find_free_port
from realhf.base.process import session_members
from realhf.impl.inference.server_process import ServerProcess

pytestmark = pytest.mark.system

# A stand-in server: starts a long-lived child of its own (the engine core), then answers /health.
SERVER = textwrap.dedent(
    """
    import http.server, subprocess, sys
    core = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "w").write(str(core.pid))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
    """
)


def test_a_killed_servers_orphans_are_killed_when_it_is_stopped(tmp_path):
    port = find_free_port("127.0.0.1")
    core_file = tmp_path / "core.pid"
    server = ServerProcess(
        [sys.executable, "-c", SERVER, str(port), str(core_file)],
        f"http://127.0.0.1:{port}",
        str(tmp_path / "server.log"),
        startup_timeout=60,
    ).start()
    try:
        core = psutil.Process(int(core_file.read_text()))
        assert set(session_members(server.popen.pid)) == {server.popen.pid, core.pid}
        os.kill(server.popen.pid, signal.SIGKILL)
        server.popen.wait(timeout=10)
        # The core outlives its server, no longer in any tree rooted at the server's pid.
        assert core.is_running() and core.ppid() != server.popen.pid
        assert session_members(server.popen.pid) == [core.pid]
    finally:
        server.stop(timeout=5)
    assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE
    assert session_members(server.popen.pid) == []
