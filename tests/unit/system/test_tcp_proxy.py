"""The test helper that simulates a partition (`helpers.tcp_proxy`): it forwards, a blackhole
cut answers nothing (and lets held requests through once healed), a reset cut resets."""

import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from helpers.tcp_proxy import TcpProxy


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def proxy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with TcpProxy("127.0.0.1", server.server_address[1]) as p:
        yield p
    server.shutdown()
    server.server_close()


def _get(url, timeout=5.0):
    with urllib.request.urlopen(f"{url}/", timeout=timeout) as r:
        return r.read()


def test_forwards_until_cut_and_again_after_heal(proxy):
    assert _get(proxy.url) == b"hello"
    assert proxy.stats()["bytes_down"] > 0

    proxy.cut("blackhole")
    with pytest.raises((TimeoutError, urllib.error.URLError)):  # accepted, never answered
        _get(proxy.url, timeout=0.5)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(_get, proxy.url, 10.0)  # sent during the cut...
        threading.Event().wait(0.3)
        assert not held.done()
        proxy.heal()
        assert held.result(timeout=10) == b"hello"  # ...answered after the heal
    assert _get(proxy.url) == b"hello"


def test_a_reset_cut_resets_every_connection(proxy):
    proxy.cut("reset")
    with pytest.raises((ConnectionResetError, urllib.error.URLError, ConnectionError)):
        _get(proxy.url)
    assert proxy.stats()["reset"] >= 1
    proxy.heal()
    assert _get(proxy.url) == b"hello"
