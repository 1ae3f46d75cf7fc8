"""The embedded tool-using task: the tiny arithmetic problems answered through the calculator.

An episode of the `tool-agent` on this task, as the chat template renders it:

    Q: Max has 5 shells. He finds 2 more. Then he loses 3. How many shells does he have now?
    A: <tool_call>{"name":"calculator","arguments":{"expression":"5+2-3"}}</tool_call></s>
    Result: 4
    A: #### 4</s>

The model writes the expression and copies the result; the calculator does the arithmetic. The
template (`TOOL_CHAT_TEMPLATE`) is the tiny model's own: a user turn is its text, an assistant
turn ends with EOS, a tool turn is "\\nResult: …\\nA:". It ignores the tool schemas (a 0.5M
model cannot read JSON schemas; it learns the one call format from the warm start). Rows carry
`sft_trace`, the assistant and tool turns the warm start trains on (tool turns off the loss).
"""

from __future__ import annotations

import json
from typing import Dict, List, Sequence

from realhf.plugins.tasks.math_synthetic import ANSWER_MARK, MathProblem, vocabulary

# transformers renders templates with trim_blocks: a newline right after a tag would vanish, so
# the tool turn's newlines are inside an expression.
TOOL_CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ m['content'] }}</s>"
    "{% elif m['role'] == 'tool' %}{{ '\\nResult: ' + m['content'] + '\\nA:' }}"
    "{% else %}{{ m['content'] }}{% endif %}"
    "{% endfor %}"
)
# Letter runs of the call format, so each is one token ("<tool_call>" becomes <, tool, _, call, >).
TOOL_WORDS = ("tool", "call", "name", "calculator", "arguments", "expression", "Result")


def tool_vocabulary() -> List[str]:
    return sorted(set(vocabulary()) | set(TOOL_WORDS))


def expression(problem: MathProblem) -> str:
    return str(problem.start) + "".join(f"{op}{n}" for op, n in problem.ops)


def call_text(expr: str) -> str:
    """The assistant's call, compact JSON (fewer tokens for a character-level model)."""
    body = json.dumps({"name": "calculator", "arguments": {"expression": expr}}, separators=(",", ":"))
    return f" <tool_call>{body}</tool_call>"


def tool_rows(problems: Sequence[MathProblem], split: str) -> List[Dict[str, object]]:
    """Prompt-dataset rows (math grading needs `solutions`) with the warm start's `sft_trace`."""
    rows = []
    for i, p in enumerate(problems):
        answer = f" {ANSWER_MARK} {p.answer}"
        rows.append(
            {
                "query_id": f"{split}-{i:06d}",
                "prompt": p.prompt,
                "solutions": [answer],
                "task": "math",
                "sft_trace": [
                    {"role": "assistant", "content": call_text(expression(p))},
                    {"role": "tool", "content": str(p.answer)},
                    {"role": "assistant", "content": answer},
                ],
            }
        )
    return rows
