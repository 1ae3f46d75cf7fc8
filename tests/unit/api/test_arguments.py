"""Issue 29 item 3: a misspelt agent or environment argument is an error before any process starts,
naming the closest argument the class takes (realhf/api/arguments.py through config validation)."""

import pytest

from realhf.api.agent import Agent
from realhf.api.arguments import accepted_arguments
from realhf.api.cli_args import AgentConfig, EnvConfig
from realhf.experiments.validation import ConfigError, check_agent, check_env


class _Base(Agent):
    def __init__(self, config=None, *, temperature: float = 1.0, **kwargs):
        super().__init__(config, **kwargs)


class _Mine(_Base):
    def __init__(self, config=None, *, max_turns: int = 2, **kwargs):
        super().__init__(config, **kwargs)

    async def run_episode(self, row, gen, env):
        return 0.0


def test_arguments_are_followed_up_the_classes_that_pass_kwargs_on():
    assert accepted_arguments(_Mine, Agent) == {"max_turns", "temperature"}


def test_a_misspelt_agent_argument_is_refused_naming_the_closest_one():
    with pytest.raises(
        ConfigError, match=r"rollout.agent.args.temprature \(did you mean rollout.agent.args.temperature\?\)"
    ):
        check_agent(AgentConfig(type=f"{__name__}:_Mine", args={"temprature": 0.1}))
    check_agent(AgentConfig(type=f"{__name__}:_Mine", args={"temperature": 0.1, "max_turns": 3}))


def test_a_built_in_agents_arguments_pass_and_a_misspelt_one_does_not():
    check_agent(AgentConfig(type="tool-agent", args={"tools": ["calculator"], "max_turns": 2}))
    with pytest.raises(
        ConfigError, match=r"rollout.agent.args.max_turn \(did you mean rollout.agent.args.max_turns\?\)"
    ):
        check_agent(AgentConfig(type="tool-agent", args={"max_turn": 2}))
    with pytest.raises(ConfigError, match=r"rollout.agent.args.anything: not an argument of .*MathSingleStepAgent"):
        check_agent(AgentConfig(type="math-single-step", args={"anything": 1}))


def test_a_misspelt_or_missing_tool_is_refused_before_start_naming_the_key():
    from omegaconf import OmegaConf

    with pytest.raises(
        ConfigError, match=r"rollout\.agent\.args\.tools: unknown tool 'calculater' \(did you mean 'calculator'\?\)"
    ):
        check_agent(AgentConfig(type="tool-agent", args={"tools": ["calculater"]}))
    with pytest.raises(ConfigError, match=r"rollout\.agent\.args\.tools=.*no attribute 'nothing_here'"):
        check_agent(AgentConfig(type="tool-agent", args={"tools": ["realhf.plugins.tools.calculator:nothing_here"]}))
    with pytest.raises(ConfigError, match=r"rollout\.agent\.args\.tools must be a list of tool names"):
        check_agent(AgentConfig(type="tool-agent", args={"tools": "calculator"}))
    # As the command line gives it (an OmegaConf list): accepted.
    check_agent(AgentConfig(type="tool-agent", args={"tools": OmegaConf.create(["calculator", "python"])}))


def test_an_environments_arguments_are_those_of_its_init_and_open_shared():
    check_env(EnvConfig(type="math", args={"check_work": True, "grader_workers": 2}))
    with pytest.raises(
        ConfigError, match=r"rollout.env.args.check_wrok \(did you mean rollout.env.args.check_work\?\)"
    ):
        check_env(EnvConfig(type="math", args={"check_wrok": True}))
    check_env(EnvConfig(type="mcp", args={"command": "python", "args": ["-m", "x"]}))
