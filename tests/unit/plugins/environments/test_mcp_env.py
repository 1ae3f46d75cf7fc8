"""The `mcp` environment against a real MCP server subprocess over stdio (tests/helpers/mcp_server.py):
its tools and schemas, results and errors as the model reads them, timeouts, a dead server, start
failures, shutdown leaving no process, and one server shared by concurrent episodes — closed from
another task than the one that opened it (the anyio task-group pitfall). The same server over
streamable HTTP on loopback is tested in test_mcp_http.py."""

import asyncio
import dataclasses
import os
import sys

import psutil
import pytest

pytest.importorskip("mcp")

from helpers.paths import TESTS_DIR
from realhf.api.cli_args import EnvConfig
from realhf.api.env import EnvFactory
from realhf.api.tools import ToolCall
from realhf.plugins.environments.mcp_env import MCPEnv, MCPServerTools

pytestmark = pytest.mark.system

SERVER_ARGS = ["-m", "helpers.mcp_server"]
SERVER_ENV = {"PYTHONPATH": os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
ENV_ARGS = {"command": sys.executable, "args": SERVER_ARGS, "env": SERVER_ENV, "start_timeout": 15}
TOOLS = ["add", "calculator", "echo", "fail", "slow"]


def server_processes():
    """The test MCP servers this process started (children or deeper)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "helpers.mcp_server" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.NoSuchProcess:
            pass
    return found


async def dead(proc, timeout=5.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"killed MCP server {proc.pid} still alive after {timeout}s")
        await asyncio.sleep(0.02)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def started(**kw):
    return await MCPServerTools(sys.executable, SERVER_ARGS, env=SERVER_ENV, **kw).start(15)


def test_tools_are_listed_with_their_schemas_and_run_on_the_server():
    async def main():
        server = await started()
        try:
            tools = server.tools()
            assert sorted(tools) == TOOLS
            add = tools["add"]
            assert add.description == "Add two integers."
            assert add.parameters["type"] == "object"
            assert add.parameters["required"] == ["a", "b"]
            assert {k: v["type"] for k, v in add.parameters["properties"].items()} == {"a": "integer", "b": "integer"}
            assert add.schema()["function"]["name"] == "add"
            assert (await add.call({"a": 2, "b": 3})).content == "5"
            assert (await tools["echo"].call({"text": "héllo\nworld"})).content == "héllo\nworld"
            # realhf checks arguments against the server's schema before sending them
            missing = await add.call({"a": 2})
            assert missing.error and "missing ['b']" in missing.content
            # the server validates types itself: its error comes back as an error result
            wrong = await add.call({"a": "x", "b": 1})
            assert wrong.error and "Error" in wrong.content
        finally:
            await server.close()

    run(main())


def test_a_raising_tool_and_a_timed_out_call_are_error_results_and_the_session_goes_on():
    async def main():
        server = await started(call_timeout=10)
        try:
            tools = server.tools()
            assert {t.timeout for t in tools.values()} == {10}
            failed = await tools["fail"].call({})
            assert failed.error and failed.content.startswith("Error: ") and "fail" in failed.content
            # a caller's shorter timeout for one call (other calls keep the generous one)
            slow = await dataclasses.replace(tools["slow"], timeout=0.5).call({"seconds": 5})
            assert slow.error and slow.content == "Error: slow timed out after 0.5s"
            quick = await tools["slow"].call({"seconds": 0.01})
            assert (quick.error, quick.content) == (False, "slept 0.01s")
            results = await asyncio.gather(*(tools["add"].call({"a": i, "b": 1}) for i in range(8)))
            assert [r.content for r in results] == [str(i + 1) for i in range(8)]
        finally:
            await server.close()

    run(main())


def test_close_stops_the_server_process_and_a_dead_server_gives_error_results():
    async def main():
        server = await started()
        procs = server_processes()
        assert len(procs) == 1
        await server.close()
        assert not server_processes()
        assert not procs[0].is_running() or procs[0].status() == psutil.STATUS_ZOMBIE

        server = await started()
        try:
            tools = server.tools()
            (proc,) = server_processes()
            proc.kill()  # not reaped here: the client's event loop owns the child
            await dead(proc)
            result = await tools["echo"].call({"text": "still there?"})
            assert result.error and "helpers.mcp_server" in result.content and "it has exited" in result.content
            assert "timed out" not in result.content  # noticed, not waited out
        finally:
            await server.close()
        assert not server_processes()

    run(main())


def test_a_server_that_cannot_start_is_named_with_its_stderr():
    async def main():
        with pytest.raises(RuntimeError, match="no-such-mcp-server-cmd.*failed to start.*FileNotFoundError"):
            await MCPServerTools("no-such-mcp-server-cmd", ["--x"]).start(10)
        exits = [sys.executable, "-c", "import sys; print('config file missing', file=sys.stderr); sys.exit(3)"]
        with pytest.raises(RuntimeError, match=r"(?s)failed to start.*stderr ends with:\nconfig file missing"):
            await MCPServerTools(exits[0], exits[1:]).start(10)
        silent = [sys.executable, "-c", "import time; time.sleep(30)"]
        with pytest.raises(TimeoutError, match=r"time.sleep\(30\).*did not start and list its tools within 1s"):
            await MCPServerTools(silent[0], silent[1:]).start(1)
        # the timed-out server was stopped, not left behind
        assert not [p for p in psutil.Process().children(recursive=True) if "time.sleep(30)" in " ".join(p.cmdline())]

    run(main())
    with pytest.raises(ValueError, match=r"set the server: rollout.env.args.command .*or rollout.env.args.url"):
        run(MCPEnv.open_shared(None))
    with pytest.raises(ValueError, match="`args` must be a list of strings"):
        MCPServerTools("python", "-m my_server")


def test_one_server_serves_concurrent_episodes_and_closes_from_another_task():
    factory = EnvFactory(EnvConfig(type="mcp", args=dict(ENV_ARGS)))

    async def episode(n):
        env = await factory.make({"query_id": f"q{n}"})
        await env.reset()
        try:
            assert sorted(env.tools) == TOOLS
            results, reward, done, info = await env.step([ToolCall("add", {"a": n, "b": 10}), ToolCall("fail")])
            assert (reward, done, info) == (0.0, False, {"errors": []})
            assert results[0].content == str(n + 10) and results[1].error
            text = (
                '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
                '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>{bad</tool_call>'
            )
            results, _, _, info = await env.step(text)
            assert results[0].content == "hi"
            assert results[1].error and "no tool named 'nope'" in results[1].content
            assert len(info["errors"]) == 1 and "not valid JSON" in info["errors"][0]
            return len(server_processes())
        finally:
            await env.aclose()

    async def main():
        counts = await asyncio.gather(*(asyncio.create_task(episode(n)) for n in range(2)))
        assert counts == [1, 1]  # opened once, shared
        assert set(await factory.tools()) == set(TOOLS)
        # worker exit: closed in a task that did not open it
        await asyncio.create_task(factory.aclose())
        assert not server_processes()

    run(main())


def test_an_env_made_alone_starts_and_stops_a_server_of_its_own():
    async def main():
        env = MCPEnv({"query_id": "q"}, **ENV_ARGS)
        await env.reset()
        try:
            (result,), *_ = await env.step([ToolCall("add", {"a": 1, "b": 1})])
            assert result.content == "2"
            with pytest.raises(ValueError, match="got dict"):
                await env.step({"name": "add"})
        finally:
            await env.aclose()
        assert not server_processes()

    run(main())
