"""The embedded tool task: its rows, its chat template, and the warm start's token traces, which
must be exactly what a tool-agent episode produces."""

import asyncio
import random

from helpers.paths import REPO
from realhf.api.cli_args import GenerationHyperparameters
from realhf.api.prompt import PromptRow
from realhf.api.tools import parse_tool_calls
from realhf.impl.dataset.prompt_encoding import encode_prompt
from realhf.plugins.tasks.math_synthetic import generate_problem
from realhf.plugins.tasks.tool_task import tool_rows
from realhf.plugins.tools.calculator import CALCULATOR
from realhf.system.rollout.episode import Gen
from realhf.system.rollout.generation_client import GenerationResult

TOOLS = f"{REPO}/assets/tiny-tools/sft"


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOOLS)


def test_a_row_holds_a_call_whose_result_is_the_answer():
    problem = generate_problem(random.Random(3))
    (row,) = tool_rows([problem], "t")
    call, result, answer = row["sft_trace"]
    (parsed,), errors = parse_tool_calls(call["content"])
    assert not errors and parsed.name == "calculator"
    assert asyncio.run(CALCULATOR.call(parsed.arguments)).content == result["content"] == str(problem.answer)
    assert answer["content"] == row["solutions"][0] == f" #### {problem.answer}"


def test_the_warm_start_trace_is_the_episode_the_tool_agent_produces():
    from realhf.experiments.sft import encode_example

    tok = _tokenizer()
    (raw,) = tool_rows([generate_problem(random.Random(5))], "t")
    row = PromptRow(
        query_id=raw["query_id"], prompt=raw["prompt"], solutions=tuple(raw["solutions"]), task="math", fields=raw
    )
    ids, mask = encode_example(tok, row, chat=True)
    call, tool_turn, answer = raw["sft_trace"]
    assert tok.decode(ids) == (
        raw["prompt"] + call["content"] + "</s>\nResult: " + tool_turn["content"] + "\nA:" + answer["content"] + "</s>"
    )
    trained = tok.decode([t for t, m in zip(ids, mask) if m])
    assert trained == call["content"] + "</s>" + answer["content"] + "</s>"

    # The same tokens as a tool-agent episode whose model 'generates' the two assistant turns.
    class Model:
        def __init__(self):
            self.turns = [call["content"], answer["content"]]

        async def generate(self, qid, input_ids, gconfig, group_size=1):
            out = tok(self.turns.pop(0), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            return GenerationResult(out, [0.0] * len(out), [0] * len(out), "stop", 1)

    async def episode():
        gen = Gen(Model(), "q", encode_prompt(tok, raw, chat=True), GenerationHyperparameters(), tok)
        await gen()
        gen.append([{"role": "tool", "content": tool_turn["content"]}])
        await gen()
        return gen.ids

    assert asyncio.run(episode()) == ids
