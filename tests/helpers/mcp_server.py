"""A tiny MCP server over stdio for the MCP environment's tests (`python -m helpers.mcp_server`).

Its tools cover the cases the client must handle: a plain result (`add`, `echo`), a tool that
raises (`fail`, an `isError` result) and one that outlasts a caller's timeout (`slow`).
"""

import asyncio

try:  # mcp 2 renamed FastMCP to MCPServer; the extra allows either major version
    from mcp.server.mcpserver import MCPServer as _Server
except ImportError:
    from mcp.server.fastmcp import FastMCP as _Server

server = _Server("realhf-test-tools")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
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


if __name__ == "__main__":
    server.run("stdio")
