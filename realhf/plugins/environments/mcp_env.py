"""The `mcp` environment: an episode's tools come from an MCP server, a subprocess over stdio or
a server over streamable HTTP.

    rollout.env.type=mcp rollout.env.args='{command: python, args: [-m, my_server]}'
    rollout.env.type=mcp rollout.env.args='{url: "http://host:8000/mcp", headers: {Authorization: "Bearer $TOKEN"}}'

    env = await factory.make(row)           # the server is started once per rollout worker
    env.tools                               # {name: realhf.api.tools.Tool}, schemas from the server
    results, reward, done, info = await env.step(completion_text_or_tool_calls)

`MCPServerTools` owns one client session to one server (the official `mcp` package,
`pip install realhf[mcp]`): a subprocess it starts (`command`), or a server already running at
`url` (streamable HTTP, with optional `headers`; `$VAR` in a header value is read from the
worker's environment, so a token need not be written into the config). The session's context
managers (stdio_client / streamable_http_client, ClientSession) hold anyio task groups, which must be entered and exited in the same asyncio task; realhf opens shared
resources inside one episode's task and closes them at worker exit from another. So the whole
session lives in one dedicated task of its own: `start` launches it and waits until the tools are
listed, `close` tells it to leave its contexts (which stops the server process) and awaits it.
Tool calls only send requests through the session, which any task may do.

When the server goes away mid-run (its process exits, its HTTP connection fails) every call
after that, and any call waiting for an answer, is an error result saying so; the episode goes
on and the worker does not crash.

`MCPEnv` runs the tool calls of a step. Without `reward_fn` it grades nothing (reward 0.0, never
done); with `reward_fn: module:function` (resolved like rollout.agent.reward_fn, called as
`reward_fn(prompt, completion, **row)` in a reward process, killed past `reward_timeout`), every step's
completion is graded by it: a number is the reward, True/False mean 1.0/0.0, and the step is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import tempfile
from typing import Any, AsyncIterator, Callable, Dict, List, Optional, Sequence, Tuple

from realhf.api.agent import load_reward_fn
from realhf.api.env import Environment, register_env
from realhf.api.tools import Tool, ToolCall, ToolResult, parse_tool_calls, run_tool_calls

_STDERR_TAIL = 2000  # characters of the server's stderr quoted in an error
_LIST_PAGES = 100  # a server that pages its tool list longer than this is looping


def _wire(model: Any) -> Dict[str, Any]:
    # The MCP wire names (inputSchema, isError, nextCursor) are the same in every SDK major
    # version, while the Python attribute names are not (mcp 2 made them snake_case).
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def _content_text(blocks: Sequence[Dict[str, Any]], structured: Any) -> str:
    """A tool result's content as the text a model reads."""
    parts = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(block.get("text", ""))
        elif kind == "resource" and "text" in block.get("resource", {}):
            parts.append(block["resource"]["text"])
        else:  # images, audio, blobs: a text model cannot read them
            parts.append(f"[{kind} content{' ' + block['mimeType'] if 'mimeType' in block else ''} omitted]")
    if not parts and structured is not None:
        return json.dumps(structured)
    return "\n".join(parts)


class ServerGone(ConnectionError):
    """The server's stdout closed (it exited or was killed), or its HTTP connection failed."""


def _cause(e: BaseException) -> str:
    """The one error inside anyio's task-group wrappers, as `Type: text`."""
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def _expand(value: Any, key: str) -> str:
    """A header value with `$VAR` / `${VAR}` read from the environment; an unset one is an error."""
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {value!r}")

    def one(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(2)
        if name not in os.environ:
            raise ValueError(f"{key} names ${name}, which is not set in the rollout worker's environment")
        return os.environ[name]

    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", one, value)


class MCPServerTools:
    """One MCP server and the client session to it: a subprocess started with `command args...`
    (stdio), or a running server at `url` (streamable HTTP); its tools as realhf Tools."""

    def __init__(
        self,
        command: str = "",
        args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        call_timeout: float = 30.0,
        *,
        url: str = "",
        headers: Optional[Dict[str, str]] = None,
        key: str = "MCP server",
    ):
        """`key`: how errors name the settings (rollout.env.args in a run)."""
        if bool(command) == bool(url):
            raise ValueError(
                f"{key}: set exactly one of `{key}.command` (a server subprocess over stdio) and "
                f"`{key}.url` (a server over streamable HTTP), got "
                + (f"both (command={command!r}, url={url!r})" if command else "neither")
            )
        if url:
            if not isinstance(url, str) or not re.match(r"^https?://", url):
                raise ValueError(f"{key}.url must be an http:// or https:// URL, got {url!r}")
            if args or env or cwd:
                raise ValueError(f"{key}: args, env and cwd are for a server subprocess (`command`), not `url`")
            if not isinstance(headers or {}, dict):
                raise ValueError(f"{key}.headers must be a mapping of header names to values, got {headers!r}")
            self.headers = {str(k): _expand(v, f"{key}.headers.{k}") for k, v in (headers or {}).items()}
            self.name, self.url, self.command, self.args = url, url, "", []
        else:
            if not isinstance(command, str):
                raise ValueError(f"{key}.command must be a non-empty string, got {command!r}")
            if isinstance(args, str) or not all(isinstance(a, (str, int, float)) for a in args):
                raise ValueError(f"MCP server {command}: `args` must be a list of strings, got {args!r}")
            if headers:
                raise ValueError(f"{key}.headers are for a server over HTTP (`url`), not a `command`")
            self.url, self.headers, self.command, self.args = "", {}, command, [str(a) for a in args]
            self.name = shlex.join([self.command, *self.args])
        self.env, self.cwd, self.call_timeout = dict(env or {}), cwd, call_timeout
        self._session: Any = None
        self._mcp_tools: List[Dict[str, Any]] = []
        self._task: Optional[asyncio.Task] = None
        self._ready: Optional[asyncio.Future] = None
        self._stop: Optional[asyncio.Event] = None
        self._gone: Optional[asyncio.Event] = None
        self._end_cause = ""  # why the session ended, once it has (e.g. the HTTP connection failed)
        # A real file (not a pipe we would have to drain): the subprocess writes its stderr here.
        self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")

    def stderr_tail(self) -> str:
        if self._stderr.closed:
            return ""
        # pread: reading must not move the offset the server's writes share with us.
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - _STDERR_TAIL * 4)
        return os.pread(fd, size - start, start).decode("utf-8", "replace")[-_STDERR_TAIL:].strip()

    def _describe(self, what: str) -> str:
        if self.url:  # a server we did not start: no stderr of ours to quote
            return f"MCP server at {self.url} {what}"
        tail = self.stderr_tail()
        return f"MCP server `{self.name}` {what}" + (
            f"; its stderr ends with:\n{tail}" if tail else " (no stderr output)"
        )

    async def start(self, timeout: float = 30.0) -> "MCPServerTools":
        """Start the server, initialize the session and list the tools (within `timeout` seconds)."""
        if self._task is not None:
            raise RuntimeError(f"MCP server `{self.name}` was already started")
        loop = asyncio.get_running_loop()
        self._ready, self._stop, self._gone = loop.create_future(), asyncio.Event(), asyncio.Event()
        self._task = loop.create_task(self._run(), name=f"mcp-session {self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            error: Optional[BaseException] = TimeoutError(
                self._describe(f"did not start and list its tools within {timeout:g}s")
            )
        except asyncio.CancelledError as e:
            error = e
        except Exception as e:
            error = RuntimeError(self._describe(f"failed to start ({_cause(e)})"))
            error.__cause__ = e
        else:
            return self
        await self._abandon()
        raise error

    async def _run(self) -> None:
        """The session's own task: enters the transport and session contexts, and leaves them
        (stopping the server) when `close` sets the stop event."""
        import anyio
        from mcp import ClientSession

        try:
            async with self._transport() as (read, write), anyio.create_task_group() as pumps:
                to_session, session_read = anyio.create_memory_object_stream(0)
                pumps.start_soon(self._pump, read, to_session)
                async with ClientSession(session_read, write) as session:
                    await self._until_gone(session.initialize())
                    listing = _wire(await self._until_gone(session.list_tools()))
                    tools = list(listing.get("tools", []))
                    for _ in range(_LIST_PAGES):
                        if not listing.get("nextCursor"):
                            break
                        from mcp.types import PaginatedRequestParams  # only servers that page need it

                        page = PaginatedRequestParams(cursor=listing["nextCursor"])
                        listing = _wire(await self._until_gone(session.list_tools(params=page)))
                        tools += listing.get("tools", [])
                    self._session, self._mcp_tools = session, tools
                    self._ready.set_result(None)
                    await self._stop.wait()
                pumps.cancel_scope.cancel()
        except BaseException as e:
            self._end_cause = _cause(e)
            if not self._ready.done():
                if isinstance(e, Exception):
                    self._ready.set_exception(e)
                else:
                    self._ready.cancel()
            if not isinstance(e, Exception):
                raise
            raise RuntimeError(self._describe(f"session ended with {_cause(e)}")) from e
        finally:
            self._session = None
            self._gone.set()  # calls still waiting for an answer end now, not at their timeout

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Tuple[Any, Any]]:
        """The (read, write) message streams to the server, over stdio or streamable HTTP."""
        if not self.url:
            from mcp import StdioServerParameters, stdio_client

            params = StdioServerParameters(command=self.command, args=self.args, env=self.env or None, cwd=self.cwd)
            async with stdio_client(params, errlog=self._stderr) as (read, write):
                yield read, write
            return
        try:
            from mcp.client.streamable_http import streamable_http_client
        except ImportError:  # mcp 1.x before streamable_http_client: the older name takes the headers
            from mcp.client.streamable_http import streamablehttp_client

            async with streamablehttp_client(self.url, headers=self.headers or None) as streams:
                yield streams[0], streams[1]
            return
        # The client the SDK itself makes (httpx in mcp 1, httpx2 in mcp 2), with our headers.
        from mcp.shared._httpx_utils import create_mcp_http_client

        # mcp 1 yields (read, write, get_session_id), mcp 2 (read, write).
        async with create_mcp_http_client(headers=self.headers or None) as client:
            async with streamable_http_client(self.url, http_client=client) as streams:
                yield streams[0], streams[1]

    async def _pump(self, source: Any, sink: Any) -> None:
        """Hands the server's messages to the session, and notes when they stop: the SDK does not
        fail a request sent after the server died (mcp 1.x waits for its answer forever)."""
        import anyio

        try:
            async for message in source:
                await sink.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session closed first: we are shutting down
        finally:
            self._gone.set()  # before the session sees the end, so its errors can say why
            sink.close()

    async def _until_gone(self, request: Any) -> Any:
        """Await a request to the server, or fail with ServerGone once the server is gone."""
        if self._gone.is_set():
            request.close()
            raise ServerGone("the connection to the server is closed")
        work, gone = asyncio.ensure_future(request), asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (work, gone):
                t.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
        if work.cancelled():
            raise ServerGone("the connection to the server closed before it answered")
        return work.result()

    async def _abandon(self) -> None:
        """A start that failed: end the session task however far it got."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # start gave up on it; mark it seen
        self._stderr.close()

    def tools(self) -> Dict[str, Tool]:
        """The server's tools as realhf Tools (each call goes to the server)."""
        if self._session is None and not self._mcp_tools:
            raise RuntimeError(f"MCP server `{self.name}`: call `await start()` before `tools()`")
        return {
            t["name"]: Tool(
                t["name"],
                t.get("description", ""),
                t.get("inputSchema") or {"type": "object", "properties": {}},
                self._caller(t["name"]),
                self.call_timeout,
            )
            for t in self._mcp_tools
        }

    def _caller(self, name: str):
        async def call(**arguments: Any) -> str:
            session = self._session
            if session is None or self._task is None or self._task.done():
                why = (
                    f": its session ended with {self._end_cause}"
                    if self._end_cause
                    else " (closed, or its session failed)"
                )
                raise RuntimeError(self._describe(f"is not running{why}"))
            try:
                result = _wire(await self._until_gone(session.call_tool(name, arguments)))
            except Exception as e:  # the transport broke (the server died): say so, with its stderr
                gone = ""
                if self._gone.is_set():
                    gone = "; the connection to it is lost" if self.url else "; it has exited (its stdout is closed)"
                    gone += f" ({self._end_cause})" if self._end_cause and self.url else ""
                raise RuntimeError(self._describe(f"failed the call ({_cause(e)}){gone}")) from e
            text = _content_text(result.get("content", []), result.get("structuredContent"))
            if result.get("isError"):
                raise RuntimeError(text or f"{name} failed")
            return text

        call.__name__ = name
        return call

    async def close(self, timeout: float = 10.0) -> None:
        """Leave the session (the SDK stops the server process, killing it if it lingers)."""
        if self._task is None:
            self._stderr.close()
            return
        task, self._task = self._task, None
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise TimeoutError(self._describe(f"did not shut down within {timeout:g}s")) from None
        except Exception:
            pass  # the session already ended with an error (e.g. the server died); nothing is left to stop
        finally:
            self._stderr.close()


ENV_KEY = "rollout.env.args"


def _load_reward_fn(path: str) -> Optional[Callable]:
    try:
        return load_reward_fn(path)
    except (ValueError, TypeError) as e:  # named as the agent's key: say which key it was
        raise ValueError(str(e).replace("rollout.agent.reward_fn", f"{ENV_KEY}.reward_fn")) from None


@register_env("mcp")
class MCPEnv(Environment):
    """Each step runs tool calls on the worker's MCP server; graded by `reward_fn` if given, else
    reward 0.0 and never done."""

    # A sync reward_fn runs in processes killed at its timeout (realhf.plugins.agents.reward_processes),
    # per function name, shared by the worker's episodes.
    _reward_processes: Dict[str, Any] = {}

    def __init__(
        self,
        row: Dict[str, Any],
        *,
        shared: Optional[MCPServerTools] = None,
        config: Any = None,
        reward_fn: str = "",
        reward_timeout: float = 60.0,
        **kwargs: Any,
    ):
        super().__init__(row, shared=shared, config=config)
        self._own_args = kwargs  # made alone (a script, a test): reset() starts a server of its own
        self._own_server = shared is None
        self.tools: Dict[str, Tool] = self.shared_tools(shared)
        self.reward_fn_name, self.reward_timeout = reward_fn, float(reward_timeout)
        self.reward_fn = _load_reward_fn(reward_fn)

    @classmethod
    def check_args(cls, args: Dict[str, Any], key: str = ENV_KEY) -> None:
        """Before any process starts: one of command/url, well-formed, and a reward_fn that imports."""
        server = {k: v for k, v in args.items() if k in ("command", "args", "env", "cwd", "url", "headers")}
        if "headers" in server and "url" in server:
            server["headers"] = {k: "" for k in (server["headers"] or {})}  # $VARs are the worker's, read there
        MCPServerTools(**server, key=key)
        _load_reward_fn(args.get("reward_fn", ""))

    @classmethod
    async def open_shared(
        cls,
        config: Any,
        command: str = "",
        args: Sequence[str] = (),
        env: Optional[Dict[str, str]] = None,
        cwd: Optional[str] = None,
        call_timeout: float = 30.0,
        start_timeout: float = 30.0,
        url: str = "",
        headers: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> MCPServerTools:
        """Start the worker's server (`command args...`) or connect to the one at `url`. `env` is
        added to the few variables the SDK passes on to a subprocess (PATH, HOME, ...; not the
        worker's whole environment, by the SDK's design)."""
        if not command and not url:
            raise ValueError(
                f"mcp env: set the server: {ENV_KEY}.command (stdio), e.g. {ENV_KEY}={{command: python, args: [-m, "
                f"my_server]}}, or {ENV_KEY}.url (streamable HTTP), e.g. {ENV_KEY}={{url: 'http://127.0.0.1:8000/mcp'}}"
            )
        server = MCPServerTools(
            command, args, env=env, cwd=cwd, call_timeout=call_timeout, url=url, headers=headers, key=ENV_KEY
        )
        return await server.start(start_timeout)

    @classmethod
    async def close_shared(cls, shared: Optional[MCPServerTools]) -> None:
        if shared is not None:
            await shared.close()

    @classmethod
    def shared_tools(cls, shared: Optional[MCPServerTools]) -> Dict[str, Tool]:
        return shared.tools() if shared is not None else {}

    async def reset(self) -> Any:
        if self._own_server and self.shared is None:
            self.shared = await self.open_shared(self.config, **self._own_args)
            self.tools = self.shared.tools()
        return None

    async def step(self, action: Any) -> Tuple[List[ToolResult], float, bool, Dict[str, Any]]:
        """`action`: a list of ToolCall, or a completion text with tool calls (graded by reward_fn)."""
        errors: List[str] = []
        if isinstance(action, str):
            calls, errors = parse_tool_calls(action)
        elif isinstance(action, (list, tuple)) and all(isinstance(c, ToolCall) for c in action):
            calls = list(action)
        else:
            raise ValueError(
                f"mcp env: an action is a list of ToolCall or a completion text, got {type(action).__name__}"
            )
        results = await run_tool_calls(calls, self.tools)
        if self.reward_fn is None or not isinstance(action, str):
            return results, 0.0, False, {"errors": errors}
        from realhf.plugins.agents.math_single_step import call_reward_fn

        processes = MCPEnv._reward_processes.get(self.reward_fn_name)
        if processes is None:  # shared by the worker's episodes, made at the first grading
            from realhf.api.cli_args import AgentConfig
            from realhf.plugins.agents.reward_processes import RewardProcesses

            n, nice = AgentConfig.reward_processes, AgentConfig.reward_nice  # the agent's defaults
            processes = MCPEnv._reward_processes[self.reward_fn_name] = RewardProcesses(self.reward_fn_name, n, nice)
        value = await call_reward_fn(
            self.reward_fn,
            self.row,
            action,
            timeout=self.reward_timeout,
            processes=processes,
            name=self.reward_fn_name,
            key=f"{ENV_KEY}.reward_fn",
        )
        reward = float(value) if not isinstance(value, bool) else (1.0 if value else 0.0)
        return results, reward, True, {"errors": errors, "success": reward > 0}

    async def aclose(self) -> None:
        if self._own_server and self.shared is not None:
            shared, self.shared = self.shared, None
            await self.close_shared(shared)
