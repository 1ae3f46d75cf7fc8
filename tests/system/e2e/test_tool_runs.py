"""Tools through the whole system (issue 29): the tool agent trains a few steps on the embedded
tool task with its calculator served by an MCP server over streamable HTTP on loopback (graded
by the `mcp` env's reward_fn), and with a calculator that runs in the python sandbox. Each run
counts the calls that reached the tool's side (the server's log, the sandbox's)."""

import os
import subprocess
import sys

import pytest

from helpers.paths import REPO, TESTS_DIR
from helpers.training_runs import SMALL_RUN, check_accounting, run_training

STEPS = 8
# The run imports helpers.*, and realhf from this checkout (not whichever one is installed).
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR]))


@pytest.fixture(scope="module")
def tool_task(tmp_path_factory):
    """The embedded tool task's data (scripts/make_tool_task.py --data-only), made once."""
    data = tmp_path_factory.mktemp("tool-task")
    subprocess.run(
        [sys.executable, "scripts/make_tool_task.py", "--out", str(data), "--data-only"]
        + ["--n-train", "400", "--n-test", "20"],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
        env=ENV,
    )
    return [
        "actor.path=assets/tiny-tools/sft",
        f"dataset.path={data}/data/train.jsonl",
        f"dataset.test_path={data}/data/test.jsonl",
        "dataset.chat_template=on",
        "rollout.agent.type=tool-agent",
        "+rollout.agent.args.max_turns=2",
        "ppo.gen.max_new_tokens=64",
        "stats.agent_metric_extremes=[tool_calls]",
    ]


def _check(proc, metrics, tmp_path):
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert any(m["success_rate"] > 0 for m in metrics), [m["success_rate"] for m in metrics]
    assert all(0.0 <= m["agent/tool_calls"] <= 2.0 for m in metrics), metrics[-1]
    assert sum(m["agent/tool_calls"] for m in metrics) > 0
    # The extremes asked for: whole numbers of calls around the mean; none of the other number.
    for m in metrics:
        assert m["agent/tool_calls_min"] <= m["agent/tool_calls"] <= m["agent/tool_calls_max"] <= 2, m
        assert float(m["agent/tool_calls_min"]).is_integer() and "agent/tool_errors_min" not in m
    check_accounting(tmp_path, out)


@pytest.mark.e2e
def test_the_tool_agent_trains_with_its_calculator_on_an_mcp_server_over_http(
    tmp_path, tool_task, no_leftover_processes
):
    pytest.importorskip("mcp")
    from helpers.mcp_http import mcp_http_server

    calls = tmp_path / "mcp-calls"
    with mcp_http_server(log=calls) as (url, server):
        proc, metrics, _ = run_training(
            tmp_path,
            "mcp-http",
            f"exp_ctrl.benchmark_steps={STEPS}",
            *SMALL_RUN,
            *tool_task,
            "+rollout.agent.args.tools=[]",  # the calculator is the server's only
            "rollout.env.type=mcp",
            f"+rollout.env.args.url={url}",
            "+rollout.env.args.reward_fn=helpers.user_agents:answer_matches",
            timeout=400,
            env=ENV,
        )
        assert server.poll() is None  # the run's end closed its sessions, not the server
    _check(proc, metrics, tmp_path)
    # Every call went to the server: it saw at least the calls the metrics count (evaluation
    # episodes call it too).
    seen = calls.read_text().split()
    assert set(seen) == {"calculator"} and len(seen) >= sum(m["agent/tool_calls"] for m in metrics)


@pytest.mark.e2e
@pytest.mark.slow  # CI: the MCP run above (the same agent through the whole system), tools/test_python_code.py
def test_the_tool_agent_trains_with_a_calculator_run_in_the_python_sandbox(tmp_path, tool_task, no_leftover_processes):
    log = tmp_path / "sandbox-runs"
    proc, metrics, _ = run_training(
        tmp_path,
        "sandbox",
        f"exp_ctrl.benchmark_steps={STEPS}",
        *SMALL_RUN,
        *tool_task,
        "+rollout.agent.args.tools=[helpers.sandbox_tools:calculator]",
        "rollout.env.check_work=false",
        timeout=400,
        env=dict(ENV, REALHF_TEST_TOOL_LOG=str(log)),
    )
    _check(proc, metrics, tmp_path)
    runs = [line.rsplit("=", 1) for line in log.read_text().splitlines()]
    # The sandbox computed the results the model read (and a right answer needs a right result):
    # at least one call per step on average, each result the expression's value.
    assert len(runs) >= STEPS and all(str(eval(expr, {"__builtins__": {}})) == result for expr, result in runs), runs
