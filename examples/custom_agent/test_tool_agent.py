"""The tool-using custom agent against scripted answers, with the tokenizer and chat template of
the embedded tool task (assets/tiny-tools/sft)."""

import asyncio

from examples.custom_agent.tool_agent import CarefulToolAgent, calculator
from realhf.testing import ScriptedModel, run_episode

ROW = {"query_id": "q1", "prompt": "Q: Max has 5 shells. He finds 2 more. How many?\nA:", "solutions": [" #### 7"]}


def call(expression):
    return f' <tool_call>{{"name":"calculator","arguments":{{"expression":"{expression}"}}}}</tool_call>'


def episode(answers):
    """The sample of one episode whose model answers `answers` in turn, and that model (its
    `inputs`: what each turn was shown)."""
    model = ScriptedModel(answers, tokenizer="tiny-tools")
    return run_episode(CarefulToolAgent, ROW, model=model).samples[0], model


def test_the_calculator_is_a_tool_with_a_schema_and_refuses_what_is_not_arithmetic():
    assert calculator.schema()["function"]["parameters"]["required"] == ["expression"]
    assert asyncio.run(calculator.call({"expression": "5+2-3"})).content == "4"
    refused = asyncio.run(calculator.call({"expression": "__import__('os')"}))
    assert refused.error and "only whole numbers" in refused.content


def test_a_right_answer_through_the_tool_earns_one_and_the_tool_result_is_off_the_loss():
    sample, model = episode([call("5+2"), " #### 7"])
    assert sample.reward == 1.0
    assert model.inputs[1].endswith("\nResult: 7\nA:")  # the second turn saw the tool's result
    mask = sample.mask().tolist()
    assert 0 in mask and mask[0] == 1 and mask[-1] == 1


def test_each_failed_call_costs_a_quarter_and_a_wrong_answer_is_minus_one():
    sample, model = episode([call("5**2"), call("5+2"), " #### 7"])
    assert sample.reward == 0.75 and "Error: ValueError: only whole numbers" in model.inputs[1]
    sample, _ = episode([" <tool_call>{oops</tool_call>", " #### 8"])
    assert sample.reward == -1.25
    sample, model = episode([call("1+1")] * 3)  # never answers: stops after three turns
    assert sample.reward == -1.0 and len(model.inputs) == 3


def test_the_run_scripts_arguments_are_the_agents():
    # examples/run_tool_agent.sh passes +rollout.agent.args.max_turns=2: the documented command
    # validates, and the agent stops after that many turns.
    from realhf.api.cli_args import AgentConfig
    from realhf.experiments.validation import check_agent

    check_agent(AgentConfig(type="examples.custom_agent.tool_agent:CarefulToolAgent", args={"max_turns": 2}))
    assert CarefulToolAgent(max_turns=2).max_turns == 2
