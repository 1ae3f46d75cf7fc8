"""Tools: schemas from plain functions, Hermes tool-call parsing, running calls with clear errors,
the calculator, and the tool agent end to end against a scripted model with a chat template."""

import asyncio
import json
import threading
import time
from typing import List, Optional

import pytest

from helpers.chat_tokenizers import HERMES, tiny_tokenizer
from realhf.api.agent import make_agent
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import EnvFactory
from realhf.api.tools import SYNC_TOOL_THREADS, ToolCall, load_tool, parse_tool_calls, run_tool_calls, tool
from realhf.impl.dataset.prompt_encoding import PromptEncodingError, encode_prompt
from realhf.plugins.tools.calculator import CALCULATOR
from realhf.system.rollout.episode import run_group
from realhf.system.rollout.generation_client import GenerationResult


@tool(timeout=0.5)
def add(a: int, b: int, note: Optional[str] = None) -> int:
    """Add two integers.

    a: the first number
    b: the second
       number
    note: ignored
    """
    return a + b


@tool(timeout=0.2)
async def slow(seconds: float) -> str:
    """Sleep."""
    await asyncio.sleep(seconds)
    return "woke"


@tool
def broken(items: List[int]) -> str:
    """Raise."""
    raise KeyError("no such item")


def test_a_function_becomes_a_tool_with_a_schema_from_its_signature_and_docstring():
    assert add.schema() == {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "required": ["a", "b"],
                "properties": {
                    "a": {"type": "integer", "description": "the first number"},
                    "b": {"type": "integer", "description": "the second number"},
                    "note": {"type": "string", "description": "ignored"},
                },
            },
        },
    }
    assert broken.parameters["properties"]["items"] == {"type": "array", "items": {"type": "integer"}}


def test_calls_return_results_and_every_failure_as_text_for_the_model():
    async def main():
        tools = {t.name: t for t in (add, slow, broken)}
        return await run_tool_calls(
            [
                ToolCall("add", {"a": 2, "b": 3}),
                ToolCall("add", {"a": 2}),
                ToolCall("add", {"a": 1, "b": 2, "c": 3}),
                ToolCall("slow", {"seconds": 5}),
                ToolCall("broken", {"items": [1]}),
                ToolCall("nope", {}),
            ],
            tools,
        )

    t0 = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - t0 < 3  # the slow call was cut at its timeout
    assert (results[0].content, results[0].error) == ("5", False)
    assert [r.error for r in results[1:]] == [True] * 5
    assert "missing ['b']" in results[1].content and "unknown ['c']" in results[2].content
    assert results[3].content == "Error: slow timed out after 0.2s"
    assert results[4].content == "Error: KeyError: 'no such item'"
    assert "no tool named 'nope'; tools: add, broken, slow" in results[5].content
    assert results[0].message() == {"role": "tool", "name": "add", "content": "5"}


def test_synchronous_calls_that_never_return_are_cut_at_the_timeout_and_hold_up_neither_the_loop_nor_other_tools():
    gate = threading.Event()

    @tool(timeout=0.2)
    def stuck(x: int) -> str:
        """Wait for a gate that opens at the test's end.

        x: ignored
        """
        gate.wait(60)
        return "late"

    async def main():
        return await asyncio.gather(*(stuck.call({"x": i}) for i in range(SYNC_TOOL_THREADS + 4)))

    try:
        t0 = time.monotonic()
        results = asyncio.run(main())  # the loop closes without joining the stuck calls' threads
        took = time.monotonic() - t0
        assert took < 5, f"the loop took {took:.1f}s to end"
        assert all(r.error and r.content == "Error: stuck timed out after 0.2s" for r in results)
        # Another synchronous tool still answers while every thread of this one is stuck.
        assert asyncio.run(add.call({"a": 1, "b": 2})).content == "3"
        # A call queued behind the stuck ones is cut at its timeout too, and never runs.
        assert asyncio.run(stuck.call({"x": 0})).content == "Error: stuck timed out after 0.2s"
    finally:
        gate.set()


def test_tool_calls_are_parsed_in_the_hermes_format_with_an_error_per_malformed_one():
    text = (
        'Let me compute. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1</tool_call>'
        '<tool_call>["add"]</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]
    assert len(errors) == 2 and "not valid JSON" in errors[0] and 'needs {"name"' in errors[1]
    assert parse_tool_calls("#### 7") == ([], [])


@pytest.mark.parametrize(
    "expression, result",
    [("(12 + 7) * 3", "57"), ("2 ** 10 / 4", "256"), ("7 / 2", "3.5"), ("-3 + 10 % 4", "-1"), ("17 // 5", "3")],
)
def test_calculator_evaluates_arithmetic(expression, result):
    assert asyncio.run(CALCULATOR.call({"expression": expression})).content == result


@pytest.mark.parametrize(
    "expression, error",
    [
        ("__import__('os').system('true')", "only numbers"),
        ("2 ** 1000", "exponent 1000 is larger than 100"),
        ("1 / 0", "ZeroDivisionError"),
        ("1 +", "not an arithmetic expression"),
    ],
)
def test_calculator_refuses_what_is_not_arithmetic(expression, error):
    r = asyncio.run(CALCULATOR.call({"expression": expression}))
    assert r.error and error in r.content


def test_tools_load_by_builtin_name_or_import_path():
    assert load_tool("calculator") is CALCULATOR
    assert load_tool(f"{__name__}:add") is add
    assert load_tool("json:dumps").name == "dumps"  # a plain function becomes a tool
    with pytest.raises(ValueError, match="unknown tool 'abacus'"):
        load_tool("abacus")


# ---- the tool agent ---------------------------------------------------------------------------------


@pytest.fixture
def hermes_tokenizer():
    return tiny_tokenizer(HERMES)


class ScriptedModel:
    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls = tokenizer, list(texts), []

    async def generate(self, qid, input_ids, gconfig, group_size=1):
        self.calls.append(list(input_ids))
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        return GenerationResult(ids, [-0.1] * len(ids), [0] * len(ids), "stop", 1)


def run_tool_agent(tokenizer, texts, **args):
    row = {"query_id": "q", "prompt": "Q: 5+2?\nA:", "solutions": [" 5+2=7\n#### 7"]}
    config = AgentConfig(type="tool-agent", args=args)
    agent = make_agent(config, tokenizer=tokenizer)
    schemas = [t.schema() for t in agent.tools.values()]
    prompt = encode_prompt(tokenizer, row, chat=True, tools=schemas)
    model = ScriptedModel(tokenizer, texts)

    async def main():
        envs = EnvFactory(EnvConfig())
        try:
            return await run_group(
                agent,
                row,
                prompt,
                qid="q@0",
                client=model,
                envs=envs,
                gconfig=GenerationHyperparameters(),
                tokenizer=tokenizer,
                agent_config=config,
                group_size=1,
            )
        finally:
            await envs.aclose()

    return asyncio.run(main()), model, prompt


def test_the_tool_agent_calls_the_calculator_and_answers_with_its_result(hermes_tokenizer):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "5+2"}}</tool_call>'
    traj, model, prompt = run_tool_agent(hermes_tokenizer, [call, " #### 7"])
    assert '"name": "calculator"' in hermes_tokenizer.decode(prompt)  # the schema is in the prompt
    (s,) = traj.samples
    assert s.reward == 1.0
    text = hermes_tokenizer.decode(s.output_ids.tolist())
    tool_turn = "<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"
    assert text == call + tool_turn + " #### 7"
    # Only the model's tokens are trained on; the second call saw the tool's answer.
    n_call = len(hermes_tokenizer(call, add_special_tokens=False)["input_ids"])
    n_turn = len(hermes_tokenizer(tool_turn, add_special_tokens=False)["input_ids"])
    assert s.mask().tolist() == [1] * n_call + [0] * n_turn + [1] * (len(s.output_ids) - n_call - n_turn)
    assert model.calls[1] == prompt + s.output_ids.tolist()[: n_call + n_turn]


def test_a_bad_tool_call_is_told_to_the_model_and_the_episode_goes_on(hermes_tokenizer):
    bad = '<tool_call>{"name": "calculator", "arguments": {"expression": "abs(-3)"}}</tool_call>'
    traj, model, _ = run_tool_agent(hermes_tokenizer, [bad, "<tool_call>{oops</tool_call>", " #### 8"])
    text = hermes_tokenizer.decode(traj.samples[0].output_ids.tolist())
    assert "Error: ValueError: only numbers" in text and "not valid JSON" in text
    assert traj.samples[0].reward == -1.0 and len(model.calls) == 3


def test_the_tool_agent_stops_after_max_turns(hermes_tokenizer):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
    traj, model, _ = run_tool_agent(hermes_tokenizer, [call] * 5, max_turns=2)
    assert len(model.calls) == 2 and traj.samples[0].reward == -1.0


def test_tools_without_a_chat_template_are_refused(hermes_tokenizer):
    plain = tiny_tokenizer()
    with pytest.raises(PromptEncodingError, match=r"offers tools \(calculator\) but prompts are not chat-templated"):
        encode_prompt(plain, {"query_id": "q", "prompt": "x"}, chat=False, tools=[CALCULATOR.schema()])
    rendered = hermes_tokenizer.decode(
        encode_prompt(hermes_tokenizer, {"query_id": "q", "prompt": "x"}, chat=True, tools=[CALCULATOR.schema()])
    )
    assert json.loads(rendered.split("<tools>")[1].split("</tools>")[0])["function"]["name"] == "calculator"
