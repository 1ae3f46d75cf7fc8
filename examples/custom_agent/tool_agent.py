"""A tool-using agent of your own: a plain function becomes a tool, and a wrong call costs reward.

bash examples/run_tool_agent.sh rollout.agent.type=examples.custom_agent.tool_agent:CarefulToolAgent
"""

import ast
import operator

from examples.custom_agent.agent import final_number
from realhf.api.agent import Agent, Outcome
from realhf.api.tools import call_tools, tool

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only whole numbers and + - *")


@tool(timeout=1.0)
def calculator(expression: str) -> int:
    """Evaluate an arithmetic expression.

    expression: whole numbers with + - *, e.g. 5+2-3
    """
    return _value(ast.parse(expression, mode="eval").body)


class CarefulToolAgent(Agent):
    """+1 for the right answer after '####' (else -1), minus 0.25 per failed tool call."""

    tools = {"calculator": calculator}  # their schemas reach the prompt through the chat template

    def __init__(self, config=None, *, max_turns: int = 3, **kwargs):
        super().__init__(config, **kwargs)  # `+rollout.agent.args.max_turns=2` arrives here
        self.max_turns = int(max_turns)

    async def run_episode(self, row, gen, env):
        errors = 0
        for _ in range(self.max_turns):
            answer = await gen()
            results = await call_tools(answer.text, self.tools)  # none when the answer calls no tool
            if not results:
                break
            errors += sum(r.error for r in results)
            gen.append([r.message() for r in results])  # tool messages: not generated, no loss
        right = final_number(answer.text) == final_number(row["solutions"][0])
        return Outcome((1.0 if right else -1.0) - 0.25 * errors, success=right)
