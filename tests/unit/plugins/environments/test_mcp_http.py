"""The `mcp` environment over streamable HTTP against a real server process on loopback
(helpers.mcp_http): tools listed and called, a bearer token sent as a header (read from the
environment), clear errors naming the URL when it cannot connect, a server that goes away mid-run
(error results, the episode goes on), config errors naming the keys, and a reward_fn grading."""

import asyncio
import socket
import sys

import pytest

pytest.importorskip("mcp")

from helpers.mcp_http import mcp_http_server
from realhf.api.cli_args import EnvConfig
from realhf.api.env import EnvFactory
from realhf.api.tools import ToolCall
from realhf.experiments.validation import ConfigError, check_env
from realhf.plugins.environments.mcp_env import MCPEnv, MCPServerTools

pytestmark = pytest.mark.system

TOOLS = ["add", "calculator", "echo", "fail", "slow"]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_tools_over_http_run_on_the_server_with_the_token_from_the_environment(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    monkeypatch.setenv("TEST_MCP_TOKEN", "s3cret")
    with mcp_http_server(log=log, token="s3cret") as (url, _):
        args = {"url": url, "headers": {"Authorization": "Bearer ${TEST_MCP_TOKEN}"}, "start_timeout": 15}
        factory = EnvFactory(EnvConfig(type="mcp", args=args))

        async def episode(n):
            env = await factory.make({"query_id": f"q{n}"})
            await env.reset()
            try:
                results, reward, done, _ = await env.step(
                    [ToolCall("calculator", {"expression": f"{n}+2*3"}), ToolCall("fail")]
                )
                assert (reward, done) == (0.0, False)
                assert results[0].content == str(n + 6) and results[1].error and "fail" in results[1].content
                results, _, _, _ = await env.step(
                    '<tool_call>{"name": "echo", "arguments": {"text": "hé"}}</tool_call>'
                )
                assert [r.content for r in results] == ["hé"]
            finally:
                await env.aclose()

        async def main():
            assert sorted(await factory.tools()) == TOOLS
            schema = (await factory.tools())["add"].parameters
            assert schema["required"] == ["a", "b"]
            await asyncio.gather(*(asyncio.create_task(episode(n)) for n in range(3)))
            await asyncio.create_task(factory.aclose())  # closed from another task than the opener

        run(main())
    assert sorted(log.read_text().split()) == ["calculator"] * 3 + ["echo"] * 3


def test_a_url_that_cannot_be_reached_is_named_within_the_timeout(tmp_path):
    async def main():
        with socket.socket() as free:  # bound, never listening: connections are refused
            free.bind(("127.0.0.1", 0))
            refused = f"http://127.0.0.1:{free.getsockname()[1]}/mcp"
            with pytest.raises(RuntimeError, match=rf"MCP server at {refused} failed to start \(.*ConnectError"):
                await MCPServerTools(url=refused).start(10)
        with socket.socket() as mute:  # listening, never answering
            mute.bind(("127.0.0.1", 0))
            mute.listen(8)
            silent = f"http://127.0.0.1:{mute.getsockname()[1]}/mcp"
            t0 = asyncio.get_running_loop().time()
            with pytest.raises(TimeoutError, match=rf"MCP server at {silent} did not start .* within 1s"):
                await MCPServerTools(url=silent).start(1)
            assert asyncio.get_running_loop().time() - t0 < 5

    run(main())
    with mcp_http_server(token="right") as (url, _):
        with pytest.raises(RuntimeError, match=rf"MCP server at {url} failed to start"):
            run(MCPServerTools(url=url, headers={"Authorization": "Bearer wrong"}).start(10))


def test_a_server_that_goes_away_gives_error_results_and_the_episode_goes_on():
    async def main(url, proc):
        env = MCPEnv({"query_id": "q"}, url=url, start_timeout=15, call_timeout=20)
        await env.reset()
        try:
            (ok,), *_ = await env.step([ToolCall("add", {"a": 1, "b": 2})])
            assert ok.content == "3"
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
            t0 = asyncio.get_running_loop().time()
            for _ in range(2):  # the call that finds it gone, and one after the session ended
                (gone,), reward, done, _ = await env.step([ToolCall("echo", {"text": "there?"})])
                assert gone.error and url in gone.content and (reward, done) == (0.0, False), gone.content
                assert "timed out" not in gone.content
            assert asyncio.get_running_loop().time() - t0 < 15  # noticed, not waited out
        finally:
            await env.aclose()  # nothing left to stop: no error

    with mcp_http_server() as (url, proc):
        run(main(url, proc))


def test_config_names_both_keys_and_checks_the_reward_fn_before_launch():
    def check(**args):
        check_env(EnvConfig(type="mcp", args=args))

    with pytest.raises(
        ConfigError, match=r"exactly one of `rollout.env.args.command` .* and `rollout.env.args.url`.*both"
    ):
        check(command=sys.executable, url="http://127.0.0.1:1/mcp")
    with pytest.raises(ConfigError, match=r"exactly one of `rollout.env.args.command`.*neither"):
        check(headers={"X": "y"})
    with pytest.raises(ConfigError, match=r"rollout.env.args.url must be an http"):
        check(url="127.0.0.1:8000")
    with pytest.raises(ConfigError, match=r"rollout.env.args.headers are for a server over HTTP"):
        check(command=sys.executable, headers={"X": "y"})
    with pytest.raises(ConfigError, match=r"rollout.env.args.reward_fn"):
        check(url="http://127.0.0.1:1/mcp", reward_fn="helpers.user_agents:no_such_function")
    with pytest.raises(ConfigError, match=r"rollout.env.args.urll \(did you mean rollout.env.args.url\?\)"):
        check(urll="http://127.0.0.1:1/mcp")
    check(url="http://127.0.0.1:1/mcp", headers={"Authorization": "Bearer $UNSET_IN_THE_LAUNCHER"})
    with pytest.raises(ValueError, match=r"rollout.env.args.headers.Authorization names \$NOT_SET_ANYWHERE"):
        MCPServerTools(url="http://x/mcp", headers={"Authorization": "$NOT_SET_ANYWHERE"}, key="rollout.env.args")


def test_a_reward_fn_grades_each_completion(tmp_path):
    row = {"query_id": "q", "prompt": "Q: 2+2?", "solutions": [" #### 4"]}

    async def main(url):
        env = MCPEnv(dict(row), url=url, reward_fn="helpers.user_agents:answer_matches", start_timeout=15)
        await env.reset()
        try:
            results, reward, done, info = await env.step(" #### 4")
            assert (results, reward, done, info["success"]) == ([], 1.0, True, True)
            _, reward, _, info = await env.step(" #### 5")
            assert (reward, info["success"]) == (0.0, False)
        finally:
            await env.aclose()

    with mcp_http_server() as (url, _):
        run(main(url))
