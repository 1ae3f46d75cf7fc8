"""A TCP proxy that a test can cut and heal: a network partition on one path, in miniature.

    with TcpProxy("127.0.0.1", 8000) as proxy:   # listens on a free loopback port
        proxy.url                                  # http://127.0.0.1:<port>
        proxy.cut("blackhole")                     # or "reset"
        proxy.heal()

Modes while cut:
- "blackhole" (a firewall DROP): connections are still accepted but nothing is read, forwarded
  or answered, on new and open connections alike; bytes wait in the kernel buffers. On `heal`
  the held connections carry on (what TCP retransmission would deliver after a partition heals),
  unless a side gave up meanwhile.
- "reset" (a firewall REJECT): every open connection is reset (RST) and new ones are reset as
  soon as they are accepted.

It runs an asyncio loop in a daemon thread of the test process; `close` (or leaving the `with`)
stops it and closes every connection. `stats()` counts connections and bytes forwarded.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Dict, Optional, Set

FORWARD, BLACKHOLE, RESET = "forward", "blackhole", "reset"


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0), as a REJECTing firewall would."""
    sock = writer.get_extra_info("socket")
    try:
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    writer.transport.abort()


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.listen_host = listen_host
        self.port: Optional[int] = None
        self.mode = FORWARD
        self._counts: Dict[str, int] = {"accepted": 0, "reset": 0, "bytes_up": 0, "bytes_down": 0}
        self._loop = asyncio.new_event_loop()
        self._open: Optional[asyncio.Event] = None  # set while forwarding
        self._writers: Set[asyncio.StreamWriter] = set()
        self._server: Optional[asyncio.base_events.Server] = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.listen_host}:{self.port}"

    # ---- control (from the test's thread) ------------------------------------------------------
    def start(self) -> "TcpProxy":
        self._thread.start()
        self._call(self._start())
        return self

    def cut(self, mode: str = BLACKHOLE) -> None:
        if mode not in (BLACKHOLE, RESET):
            raise ValueError(f"cut mode must be {BLACKHOLE!r} or {RESET!r}, not {mode!r}")
        self._call(self._set_mode(mode))

    def heal(self) -> None:
        self._call(self._set_mode(FORWARD))

    def stats(self) -> Dict[str, int]:
        return dict(self._counts, open=len(self._writers))

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # ---- the loop ------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._server = await asyncio.start_server(self._on_client, self.listen_host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_mode(self, mode: str) -> None:
        self.mode = mode
        if mode == FORWARD:
            self._open.set()
            return
        self._open.clear()
        if mode == RESET:
            for w in list(self._writers):
                self._counts["reset"] += 1
                _reset(w)
            self._writers.clear()

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:  # held connections and pumps
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._counts["accepted"] += 1
        if self.mode == RESET:
            self._counts["reset"] += 1
            _reset(writer)
            return
        self._writers.add(writer)
        upstream_writer = None
        try:
            await self._open.wait()  # blackholed: accepted, never connected through
            if self.mode == RESET or writer.is_closing():
                return
            up_reader, upstream_writer = await asyncio.open_connection(*self.target)
            self._writers.add(upstream_writer)
            await asyncio.gather(
                self._pump(reader, upstream_writer, "bytes_up"), self._pump(up_reader, writer, "bytes_down")
            )
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for w in (writer, upstream_writer):
                if w is not None:
                    self._writers.discard(w)
                    if not w.is_closing():
                        w.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, counter: str) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                await self._open.wait()  # a cut while reading: hold what was read
                if not data:
                    break
                if writer.is_closing():
                    return
                # Counted before the write: the peer may read the bytes (and a test read the
                # stats from its own thread) before this task runs its next line.
                self._counts[counter] += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            if not writer.is_closing():
                try:
                    writer.write_eof()
                except (OSError, RuntimeError):
                    writer.close()
