"""The `tool-agent`: answers with the help of tools.

    generate → run the completion's <tool_call>s → their results (or error texts) back as tool
    messages → generate again … until a completion without a tool call, or `max_turns`

then the environment grades the last completion (math: ±1). The tools are `tools` (agent args:
built-in names `calculator`, `python`, or `module:function`) plus whatever the environment offers
(`Environment.shared_tools`, e.g. an MCP server's); their schemas reach the model through the
chat template, so the model needs one (and has to have learnt its tool-call format: `tool_format`,
by default read from the tokenizer, realhf.api.tool_formats; Hermes for the tiny model). Tool
results are appended as chat messages: no loss, never re-encoded model output. A malformed call,
an unknown tool, a tool's exception or timeout are told to the model as text; the episode goes on.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

from realhf.api.agent import Agent, EpisodeResult, register_agent
from realhf.api.tool_formats import tool_call_parser
from realhf.api.tools import call_tools, load_tool
from realhf.plugins.agents.math_single_step import graded


@register_agent("tool-agent")
class ToolAgent(Agent):
    def __init__(
        self,
        config: Any = None,
        *,
        tools: Sequence[str] = ("calculator",),
        max_turns: int = 4,
        tool_format: str = "auto",
        **kwargs: Any,
    ):
        super().__init__(config, **kwargs)
        self.parse = tool_call_parser(tool_format, self.tokenizer, key="rollout.agent.args.tool_format")
        self.tools = {t.name: t for t in map(load_tool, tools)}
        self.max_turns = int(max_turns)
        if self.max_turns < 1:
            raise ValueError(f"tool-agent: max_turns must be >= 1, got {max_turns}")

    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        tools = {**self.tools, **(getattr(env, "tools", None) or {})}
        n_calls = n_errors = 0
        for _ in range(self.max_turns):
            answer = await gen()
            results = await call_tools(answer.text, tools, self.parse)
            if not results:
                break
            n_calls += len(results)
            n_errors += sum(r.error for r in results)
            gen.append([r.message() for r in results])
        _, reward, _, _ = await env.step(answer.text)
        outcome = graded(reward)
        outcome.info.update(tool_calls=n_calls, tool_errors=n_errors)
        return outcome
