"""Tool-call formats (realhf.api.tool_formats) and schemas from transformers: the calls a chat
template writes are the calls parsed back (Hermes, Llama 3 JSON, Mistral), the format chosen from
the tokenizer (its response template, else its chat template), malformed calls told one by one,
and a Google-docstring function's schema built by transformers.get_json_schema."""

import json
from typing import List, Optional

import pytest

from helpers.chat_tokenizers import HERMES, HERMES_RESPONSE, LLAMA3_JSON, MISTRAL, tiny_tokenizer
from realhf.api.agent import make_agent
from realhf.api.cli_args import AgentConfig
from realhf.api.tool_formats import detect_format, parse_llama3, parse_mistral, tool_call_parser
from realhf.api.tools import ToolCall, parse_tool_calls, tool

CALLS = [
    {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "5+2-3"}}},
    {"type": "function", "function": {"name": "lookup", "arguments": {"city": "Zürich", "days": 2}}},
]
WANT = [ToolCall("calculator", {"expression": "5+2-3"}), ToolCall("lookup", {"city": "Zürich", "days": 2})]


def rendered_reply(template: str, marker: str) -> str:
    """The assistant turn the chat template writes for CALLS (what a model trained on it emits)."""
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "", "tool_calls": CALLS}]
    text = tiny_tokenizer(template).apply_chat_template(messages, tokenize=False)
    return text[text.rindex(marker) + len(marker) :]


def test_llama3_and_mistral_calls_written_by_their_templates_are_parsed_back():
    llama = rendered_reply(LLAMA3_JSON, "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert llama.startswith('{"name": "calculator", "parameters"')
    assert parse_llama3(llama) == (WANT, [])
    assert parse_llama3("<|python_tag|>" + llama.replace("}{", "}; {")) == (WANT, [])
    assert parse_llama3("The answer is 4.") == ([], [])  # a plain answer calls nothing
    mistral = rendered_reply(MISTRAL, "[/INST]")
    assert mistral.startswith("[TOOL_CALLS][{")
    assert parse_mistral(mistral) == (WANT, [])
    assert parse_mistral('[TOOL_CALLS]calculator[ARGS]{"expression": "5+2-3"}') == (WANT[:1], [])
    assert parse_mistral("#### 4") == ([], [])


def test_malformed_calls_are_told_one_by_one():
    calls, errors = parse_llama3('{"name": "calculator", "parameters": {"expression": "1+1"}}; {"name": ')
    assert calls == [ToolCall("calculator", {"expression": "1+1"})]
    assert len(errors) == 1 and "not valid JSON" in errors[0]
    calls, errors = parse_mistral('[TOOL_CALLS][{"arguments": {}}, {"name": "f", "arguments": "{bad"}]')
    assert calls == [] and len(errors) == 2
    assert '"name": ...' in errors[0] and "arguments of f are not a JSON object" in errors[1]


def test_the_format_is_chosen_from_the_tokenizer():
    assert detect_format(None) == "hermes"
    assert detect_format(tiny_tokenizer()) == "hermes"  # the tiny model: no template of this kind
    assert detect_format(tiny_tokenizer(HERMES)) == "hermes"
    assert detect_format(tiny_tokenizer(LLAMA3_JSON)) == "llama3"
    assert detect_format(tiny_tokenizer(MISTRAL)) == "mistral"
    declared = tiny_tokenizer(HERMES)
    declared.response_template = HERMES_RESPONSE
    assert detect_format(declared) == "tokenizer"
    assert tool_call_parser("auto", tiny_tokenizer(MISTRAL)) is parse_mistral
    assert tool_call_parser("hermes", tiny_tokenizer(MISTRAL)) is parse_tool_calls
    with pytest.raises(ValueError, match="tool_format='openai': use one of auto, hermes"):
        tool_call_parser("openai")
    with pytest.raises(ValueError, match="declares no response_template"):
        tool_call_parser("tokenizer", tiny_tokenizer())


def test_a_declared_response_template_is_parsed_by_transformers():
    tok = tiny_tokenizer(HERMES)
    tok.response_template = HERMES_RESPONSE
    parse = tool_call_parser("auto", tok)
    text = "".join(
        f'<tool_call>{{"name": "{c["function"]["name"]}", "arguments": {json.dumps(c["function"]["arguments"])}}}</tool_call>'
        for c in CALLS
    )
    assert parse("Let me compute. " + text) == (WANT, [])
    assert parse("#### 4") == ([], [])
    calls, errors = parse("<tool_call>{bad</tool_call>")
    assert calls == [] and len(errors) == 1 and "could not be parsed" in errors[0]


def test_the_tool_agent_reads_the_format_from_its_tokenizer_or_its_args():
    agent = make_agent(AgentConfig(type="tool-agent"), tokenizer=tiny_tokenizer(MISTRAL))
    assert agent.parse is parse_mistral
    agent = make_agent(AgentConfig(type="tool-agent", args={"tool_format": "llama3"}), tokenizer=tiny_tokenizer())
    assert agent.parse is parse_llama3
    with pytest.raises(ValueError, match="rollout.agent.args.tool_format='x'"):
        make_agent(AgentConfig(type="tool-agent", args={"tool_format": "x"}))


def test_a_google_docstring_schema_comes_from_transformers_and_others_fall_back():
    from transformers.utils import get_json_schema

    def forecast(city: str, days: Optional[int] = None, tags: List[str] = ()) -> str:
        """Weather for a city,
        over some days.

        Args:
            city: the city's name
            days: how many days ahead
            tags: labels
        """

    made = tool(forecast)
    want = get_json_schema(forecast)["function"]
    assert made.parameters == want["parameters"]  # transformers' own, e.g. nullable for Optional
    assert made.parameters["properties"]["days"].get("nullable") is True
    assert made.description == "Weather for a city, over some days."

    def plain(city: str, days: int = 1) -> str:
        """Weather.

        city: the city's name
        """

    fallback = tool(plain)  # not Google style, `days` undescribed: transformers has no schema for it
    assert fallback.parameters == {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "the city's name"}, "days": {"type": "integer"}},
        "required": ["city"],
    }
