"""A tiny MCP server for the MCP environment's tests, over stdio (`python -m helpers.mcp_server`)
or streamable HTTP on loopback (`python -m helpers.mcp_server --http [--token T] [--log FILE]`).

Its tools cover the cases the client must handle: a plain result (`add`, `echo`), a tool that
raises (`fail`, an `isError` result), one that outlasts a caller's timeout (`slow`), and the
embedded tool task's `calculator`. Over HTTP it binds a free port itself (no race between picking
a port and binding it) and prints `URL http://127.0.0.1:PORT/mcp` as its first stdout line; with
`--token` it answers 401 to requests without `Authorization: Bearer T`; with `--log` it appends a
line per tool call to FILE, so a test can count the calls that reached it.
"""

import argparse
import asyncio
import os
import socket
import sys

try:  # mcp 2 renamed FastMCP to MCPServer; the extra allows either major version
    from mcp.server.mcpserver import MCPServer as _Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as _Server

from realhf.plugins.tools.calculator import calculate

server = _Server("realhf-test-tools")
CALL_LOG = os.environ.get("REALHF_TEST_MCP_LOG", "")


def _logged(name: str) -> None:
    if CALL_LOG:
        with open(CALL_LOG, "a") as f:
            f.write(name + "\n")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    _logged("add")
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    _logged("echo")
    return text


@server.tool()
def fail() -> str:
    """Always raise."""
    raise ValueError("fail was asked to fail")


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep, then say how long."""
    await asyncio.sleep(seconds)
    return f"slept {seconds:g}s"


@server.tool()
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    _logged("calculator")
    return calculate(expression)


def _with_token(app, token: str):
    """The ASGI app, answering 401 to HTTP requests without the bearer token."""
    want = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != want:
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
            return
        await app(scope, receive, send)

    return guarded


def serve_http(token: str) -> None:
    import uvicorn

    app = server.streamable_http_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections made as soon as the URL is out wait for uvicorn, not refused
    print(f"URL http://127.0.0.1:{sock.getsockname()[1]}/mcp", flush=True)
    # The app's lifespan runs its session manager; the token check passes lifespan events through.
    config = uvicorn.Config(_with_token(app, token) if token else app, log_level="warning", lifespan="on")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", action="store_true", help="streamable HTTP on a free loopback port")
    parser.add_argument("--token", default="", help="require this bearer token (HTTP)")
    parser.add_argument("--log", default="", help="append a line per tool call to this file")
    opts = parser.parse_args()
    CALL_LOG = opts.log or CALL_LOG
    if opts.http:
        serve_http(opts.token)
    else:
        server.run("stdio")
    sys.exit(0)
