"""Tool-call formats: how a completion's tool calls are read, for the models that write them
differently.

    parse = tool_call_parser("auto", tokenizer)        # or "hermes", "llama3", "mistral", "tokenizer"
    calls, errors = parse(completion_text)             # ToolCalls, and an error text per malformed one

- `hermes` (Qwen, Hermes, SmolLM3, the embedded tiny model): `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
- `llama3` (Llama 3.1+ JSON tool calling): the completion is `{"name": …, "parameters": {…}}`, maybe
  after `<|python_tag|>`, several separated by `;`.
- `mistral`: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, or `[TOOL_CALLS]name[ARGS]{…}` (newer
  tokenizers).
- `tokenizer`: the tokenizer's own declaration, `tokenizer.response_template`, read by transformers'
  `tokenizer.parse_response` (transformers' response parsing; one malformed call fails the message,
  which then comes back as one error).

`auto` takes `tokenizer` when the tokenizer declares a response template, else the format its chat
template writes (`[TOOL_CALLS]` → mistral, `<|python_tag|>` → llama3), else hermes. transformers
ships no response templates for these formats, and its parser gives no per-call errors, so the
three named formats are parsed here; each malformed call is told to the model as its own error.
Special tokens (`[TOOL_CALLS]`, `<|python_tag|>`) must be in the decoded text for these to see them.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from realhf.api.tools import ToolCall, parse_tool_calls

Parsed = Tuple[List[ToolCall], List[str]]
FORMATS = ("auto", "hermes", "llama3", "mistral", "tokenizer")
_DECODER = json.JSONDecoder()


def _call(obj: Any, raw: str, args_keys: Tuple[str, ...]) -> Tuple[Optional[ToolCall], str]:
    """A ToolCall from `{"name": ..., <args_key>: {...}}` (arguments maybe a JSON string), or an error."""
    if isinstance(obj, dict) and isinstance(
        obj.get("function"), dict
    ):  # OpenAI's {"type": "function", "function": {...}}
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        want = ", ".join(f'"{k}": {{...}}' for k in args_keys[:1])
        return None, f'Error: a tool call needs {{"name": ..., {want}}}, got: {raw.strip()[:200]}'
    args = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(args, str):  # some models send the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"Error: the arguments of {obj['name']} are not a JSON object: {args[:200]}"
    return ToolCall(obj["name"], args), ""


def _json_error(e: json.JSONDecodeError, raw: str) -> str:
    return f"Error: a tool call is not valid JSON ({e.msg} at column {e.colno}): {raw.strip()[:200]}"


def parse_llama3(text: str) -> Parsed:
    """`{"name": ..., "parameters": {...}}` objects making up the whole completion (after an
    optional `<|python_tag|>`), separated by `;` or whitespace; a completion that does not start
    with `{` calls nothing."""
    body = text.strip()
    body = body[len("<|python_tag|>") :].lstrip() if body.startswith("<|python_tag|>") else body
    for end in ("<|eom_id|>", "<|eot_id|>"):
        body = body[: -len(end)].rstrip() if body.endswith(end) else body
    calls: List[ToolCall] = []
    errors: List[str] = []
    pos = 0
    while body.startswith("{", pos):
        try:
            obj, pos = _DECODER.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            errors.append(_json_error(e, body[pos:]))
            break
        call, error = _call(obj, json.dumps(obj), ("parameters", "arguments"))
        calls += [call] if call else []
        errors += [error] if error else []
        pos = len(body) - len(body[pos:].lstrip().lstrip(";").lstrip())
    return calls, errors


_MISTRAL_NAMED = re.compile(r"\s*([\w.\-]+)(?:\[CALL_ID\]\w*)?\[ARGS\]")


def parse_mistral(text: str) -> Parsed:
    """The calls after each `[TOOL_CALLS]`: a JSON list of `{"name", "arguments"}`, or `name[ARGS]{...}`."""
    calls: List[ToolCall] = []
    errors: List[str] = []
    for chunk in text.split("[TOOL_CALLS]")[1:]:
        start = len(chunk) - len(chunk.lstrip())
        named = _MISTRAL_NAMED.match(chunk)
        try:
            if named:
                args, _ = _DECODER.raw_decode(chunk, named.end())
                items: List[Any] = [{"name": named.group(1), "arguments": args}]
            else:
                items, _ = _DECODER.raw_decode(chunk, start)
                items = items if isinstance(items, list) else [items]
        except json.JSONDecodeError as e:
            errors.append(_json_error(e, chunk))
            continue
        for obj in items:
            call, error = _call(obj, json.dumps(obj), ("arguments", "parameters"))
            calls += [call] if call else []
            errors += [error] if error else []
    return calls, errors


def tokenizer_parser(tokenizer: Any) -> Callable[[str], Parsed]:
    """transformers' response parsing with the tokenizer's `response_template`."""
    if getattr(tokenizer, "response_template", None) is None:
        raise ValueError(
            f"tool_format=tokenizer: the tokenizer ({type(tokenizer).__name__}) declares no response_template; "
            f"choose one of {', '.join(f for f in FORMATS if f != 'tokenizer')}"
        )

    def parse(text: str) -> Parsed:
        try:
            message = tokenizer.parse_response(text, prefix="")
        except ValueError as e:  # transformers fails the whole message on one malformed region
            return [], [f"Error: the tool calls could not be parsed: {str(e).splitlines()[0][:300]}"]
        calls: List[ToolCall] = []
        errors: List[str] = []
        for obj in message.get("tool_calls") or []:
            call, error = _call(obj, json.dumps(obj, default=str), ("arguments", "parameters"))
            calls += [call] if call else []
            errors += [error] if error else []
        return calls, errors

    return parse


_BY_NAME: Dict[str, Callable[[str], Parsed]] = {
    "hermes": parse_tool_calls,
    "llama3": parse_llama3,
    "mistral": parse_mistral,
}


def detect_format(tokenizer: Any) -> str:
    """The format a tokenizer declares (a response template) or its chat template writes."""
    if tokenizer is None:
        return "hermes"
    if getattr(tokenizer, "response_template", None) is not None:
        return "tokenizer"
    template = getattr(tokenizer, "chat_template", None) or ""
    template = template if isinstance(template, str) else " ".join(map(str, dict(template).values()))
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template:
        return "llama3"
    return "hermes"


def tool_call_parser(fmt: str = "auto", tokenizer: Any = None, key: str = "tool_format") -> Callable[[str], Parsed]:
    """The parser for `fmt` (one of FORMATS); `auto` reads the tokenizer (detect_format)."""
    if fmt not in FORMATS:
        raise ValueError(f"{key}={fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = detect_format(tokenizer)
    return tokenizer_parser(tokenizer) if fmt == "tokenizer" else _BY_NAME[fmt]
