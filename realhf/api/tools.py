"""Tools: plain Python functions an agent's model may call (docs/architecture.md §8.4).

    from realhf.api.tools import tool

    @tool(timeout=5)
    def add(a: int, b: int) -> int:
        \"\"\"Add two integers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return a + b

    add.schema()                  # the OpenAI/Hermes function schema, from the signature and docstring
    await add.call({"a": 1, "b": 2})   # "3" (a ToolResult); errors and timeouts come back as text

A typed function with a Google-style docstring (every argument described under `Args:`) gets
the schema transformers builds for chat templates (`transformers.utils.get_json_schema`); any
other function (`name: text` lines, a missing description or an annotation transformers cannot
express) gets one built here from the annotations and docstring, so every function stays a tool.

The model calls tools in the format its chat template teaches it, by default the Hermes/Qwen one:
`<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>` (other formats:
realhf.api.tool_formats). `call_tools(text, tools)` finds them in a completion and runs them concurrently, each under its timeout: one ToolResult per
call, a malformed call's being its error text. Each goes back to the model as a
`{"role": "tool", "content": ...}` message (`gen.append([r.message() for r in results])`).
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import inspect
import json
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from realhf.base.daemon_threads import DaemonThreads

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string", list: "array", dict: "object"}
TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _json_type(annotation: Any) -> Dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(args[0]) if len(args) == 1 else {}
    if origin in (list, List, Sequence):
        (item,) = typing.get_args(annotation) or (Any,)
        return {"type": "array", "items": _json_type(item)} if item is not Any else {"type": "array"}
    if origin in (dict, Dict):
        return {"type": "object"}
    return {"type": _JSON_TYPES[annotation]} if annotation in _JSON_TYPES else {}


def _doc_parts(doc: str) -> Tuple[str, Dict[str, str]]:
    """The description (text before the first `name: text` line) and each parameter's text."""
    description, params, current = [], {}, None
    for line in inspect.cleandoc(doc or "").splitlines():
        m = re.match(r"^\s*(?:[-*]\s*)?(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$", line)
        if m and not line.lower().startswith(("args", "arguments", "returns", "parameters")):
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
        elif current is None and line.strip().lower() not in ("args:", "arguments:", "parameters:"):
            description.append(line)
    return " ".join(x.strip() for x in description if x.strip()), params


@dataclass
class ToolResult:
    name: str
    content: str
    error: bool = False

    def message(self) -> Dict[str, str]:
        named = {"name": self.name} if self.name else {}  # a malformed call has no tool name
        return {"role": "tool", **named, "content": self.content}


# A synchronous tool's calls run on daemon threads of its own, at most this many at once: a call
# that never returns (a network read without a timeout) is cut at the tool's timeout but its thread
# cannot be, and on asyncio's default executor such threads would be joined when the worker's loop
# ends (holding its exit for good) and, six stuck on two cores, would starve every other tool.
SYNC_TOOL_THREADS = 16


@dataclass
class Tool:
    name: str
    description: str
    parameters: Dict[str, Any]
    fn: Callable[..., Any]
    timeout: float = 10.0
    _threads: Optional[DaemonThreads] = field(default=None, init=False, repr=False, compare=False)

    def schema(self) -> Dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    async def call(self, arguments: Dict[str, Any]) -> ToolResult:
        """Run the tool on `arguments`; a bad argument, an exception or a timeout is a result too
        (error=True, its text for the model to read)."""
        problem = self._check(arguments)
        if problem:
            return ToolResult(self.name, f"Error: {problem}", True)
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = await asyncio.wait_for(self.fn(**arguments), self.timeout)
            else:
                if self._threads is None:
                    self._threads = DaemonThreads(SYNC_TOOL_THREADS, name=f"tool-{self.name}")
                call = self._threads.submit(functools.partial(self.fn, **arguments))
                value = await asyncio.wait_for(asyncio.wrap_future(call), self.timeout)
        except asyncio.TimeoutError:
            return ToolResult(self.name, f"Error: {self.name} timed out after {self.timeout:g}s", True)
        except Exception as e:  # noqa: BLE001 - the model reads the error, the episode goes on
            return ToolResult(self.name, f"Error: {type(e).__name__}: {e}", True)
        return ToolResult(self.name, value if isinstance(value, str) else json.dumps(value, default=str))

    def _check(self, arguments: Any) -> str:
        if not isinstance(arguments, dict):
            return f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}"
        props, required = self.parameters.get("properties", {}), self.parameters.get("required", [])
        missing = [k for k in required if k not in arguments]
        unknown = [k for k in arguments if k not in props]
        if missing or unknown:
            return (
                f"{self.name} takes ({', '.join(props)})"
                + (f"; missing {missing}" if missing else "")
                + (f"; unknown {unknown}" if unknown else "")
            )
        return ""


def _transformers_schema(f: Callable) -> Optional[Dict[str, Any]]:
    """transformers' schema of `f` ({"name", "description", "parameters"}), or None where it has
    none: no Google-style `Args:` section describing every argument, or a type it cannot express."""
    if "Args:" not in (f.__doc__ or ""):
        return None  # not Google style: its parser would fail on every argument anyway
    try:
        from transformers.utils import get_json_schema
        from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException
    except ImportError:  # transformers without it (older than 4.42)
        return None
    try:
        schema = get_json_schema(f)
    except (DocstringParsingException, TypeHintParsingException):
        return None
    schema = schema.get("function", schema)  # {"type": "function", "function": {...}} in transformers 4.x and 5
    # one line, as a docstring's wrapped text reads in the prompt (the fallback's descriptions too)
    schema["description"] = " ".join(schema.get("description", "").split())
    for prop in schema["parameters"].get("properties", {}).values():
        if "description" in prop:
            prop["description"] = " ".join(prop["description"].split())
    return schema


def tool(fn: Optional[Callable] = None, *, name: str = "", timeout: float = 10.0) -> Any:
    """Make a Tool of a function (sync or async); as `@tool` or `@tool(name=..., timeout=...)`."""

    def make(f: Callable) -> Tool:
        schema = _transformers_schema(f)
        if schema is not None:
            return Tool(name or f.__name__, schema.get("description", ""), schema["parameters"], f, timeout)
        description, docs = _doc_parts(f.__doc__ or "")
        hints = typing.get_type_hints(f)
        props, required = {}, []
        for p in inspect.signature(f).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            prop = _json_type(hints.get(p.name, Any))
            if p.name in docs:
                prop["description"] = docs[p.name]
            props[p.name] = prop
            if p.default is p.empty:
                required.append(p.name)
        return Tool(
            name or f.__name__, description, {"type": "object", "properties": props, "required": required}, f, timeout
        )

    return make(fn) if fn is not None else make


@dataclass
class ToolCall:
    name: str
    arguments: Dict[str, Any] = field(default_factory=dict)


def parse_tool_calls(text: str) -> Tuple[List[ToolCall], List[str]]:
    """The `<tool_call>{json}</tool_call>` calls in `text`, and an error text per malformed one."""
    calls, errors = [], []
    for raw in TOOL_CALL.findall(text):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            errors.append(f"Error: a tool call is not valid JSON ({e.msg} at column {e.colno}): {raw.strip()[:200]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f'Error: a tool call needs {{"name": ..., "arguments": {{...}}}}, got: {raw.strip()[:200]}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models send the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"Error: the arguments of {obj['name']} are not a JSON object: {args[:200]}")
                continue
        calls.append(ToolCall(obj["name"], args))
    return calls, errors


async def run_tool_calls(calls: Sequence[ToolCall], tools: Dict[str, Tool]) -> List[ToolResult]:
    """Run the calls concurrently; an unknown tool's result says which exist."""

    async def one(call: ToolCall) -> ToolResult:
        t = tools.get(call.name)
        if t is None:
            return ToolResult(call.name, f"Error: no tool named {call.name!r}; tools: {', '.join(sorted(tools))}", True)
        return await t.call(call.arguments)

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def call_tools(
    text: str,
    tools: Dict[str, Tool],
    parse: Callable[[str], Tuple[List[ToolCall], List[str]]] = parse_tool_calls,
) -> List[ToolResult]:
    """Parse the tool calls in a completion (Hermes by default; realhf.api.tool_formats for others)
    and run them: the results in call order, then one error result per malformed call; empty when
    `text` calls no tool."""
    calls, errors = parse(text)
    return await run_tool_calls(calls, tools) + [ToolResult("", e, True) for e in errors]


BUILTIN_TOOLS = {
    "calculator": "realhf.plugins.tools.calculator:CALCULATOR",
    "python": "realhf.plugins.tools.python_code:PYTHON_TOOL",
}


def load_tool(name: str, key: str = "rollout.agent.args.tools") -> Tool:
    """A built-in tool by name (calculator, python) or `module:object` / `path/to/file.py:object`
    (a Tool, or a function made into one)."""
    from realhf.base.importing import IMPORT_PATH_FORMS, import_object

    if not isinstance(name, str):
        raise ValueError(f"{key}: a tool is named by a string, got {name!r}")
    path = BUILTIN_TOOLS.get(name, name)
    if ":" not in path:
        close = difflib.get_close_matches(name, BUILTIN_TOOLS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"{key}: unknown tool {name!r}{hint}: use one of {', '.join(BUILTIN_TOOLS)} or {IMPORT_PATH_FORMS}"
        )
    obj = import_object(path, key)
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return tool(obj)
    raise ValueError(f"tool {name!r} is a {type(obj).__name__}, not a function or a realhf.api.tools.Tool")
