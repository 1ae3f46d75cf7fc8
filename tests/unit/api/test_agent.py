"""Specification of the Agent / Environment API and the built-in math agents (issue 3 item 4).

The agents run against the real `math` environment and the tiny-math tokenizer; generation is a
scripted client (the real client is specified in tests/unit/system/test_generation_client.py).
"""

import asyncio
from typing import List, Optional

import pytest

from realhf.api.agent import Agent, Prompt, agent_class, keep_group, make_agent, register_agent, success_reward
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import Environment, make_env
from realhf.api.trajectory import Trajectory
from realhf.system.generation_client import GenerationResult

from helpers.trajectories import TINY_SFT as TOKENIZER


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER)


class ScriptedClient:
    """Answers generate() calls with the next scripted text, as version-`version` tokens."""

    def __init__(self, tokenizer, texts: List[str], version: int = 0):
        self.tokenizer, self.texts, self.version = tokenizer, list(texts), version
        self.calls = []

    async def generate(self, qid, input_ids, gconfig, group_size=1, max_new_tokens=None):
        self.calls.append(list(input_ids))
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return GenerationResult(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop", 1)

    async def generate_group(self, qid, input_ids, gconfig, n, max_new_tokens=None):
        return [await self.generate(qid, input_ids, gconfig, n) for _ in range(n)]


def prompt(tokenizer, answer="7") -> Prompt:
    text = "Q: Max has 5 shells. He finds 2 more. How many shells does Max have now?\nA:"
    return Prompt(qid="q@0", query_id="q", prompt=text,
                  prompt_ids=tuple(tokenizer(text, add_special_tokens=False)["input_ids"]),
                  solutions=(f" 5+2=7\n#### {answer}",), task="math")


def run_agent(config: AgentConfig, tokenizer, texts, group_size) -> Optional[Trajectory]:
    async def main():
        env = make_env(EnvConfig())
        try:
            agent = make_agent(config, gconfig=GenerationHyperparameters(), group_size=group_size, tokenizer=tokenizer)
            client = ScriptedClient(tokenizer, texts)
            return await agent.collect_trajectory(prompt(tokenizer), env, client), client
        finally:
            await env.aclose()

    return asyncio.run(main())


# ---- rewards and the group filter ---------------------------------------------------------------


def test_reward_is_success_mapped_to_plus_minus_one_minus_bias_times_scaling():
    assert success_reward(1, 0.0, 1.0) == 1.0 and success_reward(0, 0.0, 1.0) == -1.0
    # bias 0.5, scaling 5: ((1 − 0.5)·2 − 0.5)·5 = 2.5 and ((0 − 0.5)·2 − 0.5)·5 = −7.5.
    assert success_reward(1, 0.5, 5.0) == 2.5 and success_reward(0, 0.5, 5.0) == -7.5


def test_group_filter_bounds_are_strict():
    four = lambda k: [1.0] * k + [0.0] * (4 - k)  # noqa: E731 - k successes of 4
    assert keep_group(four(2), 0.5, 1.0) and not keep_group(four(1), 0.5, 1.0)  # 0.5 kept, 0.25 dropped
    assert keep_group(four(2), 0.0, 0.5) and not keep_group(four(3), 0.0, 0.5)  # 0.5 kept, 0.75 dropped
    assert keep_group(four(0), 0.0, 1.0) and keep_group(four(4), 0.0, 1.0)  # defaults keep everything


def test_single_step_agent_grades_each_answer_and_builds_the_trajectory(tokenizer):
    cfg = AgentConfig(type="math-single-step", reward_bias=0.0, reward_scaling=2.0)
    traj, client = run_agent(cfg, tokenizer, [" 5+2=7\n#### 7", " 5+2=8\n#### 8", " #### 7", "no idea"], 4)
    assert [s.reward for s in traj.samples] == [2.0, -2.0, 2.0, -2.0]
    assert traj.qid == "q@0" and traj.metadata["query_id"] == "q" and traj.metadata["success_rate"] == 0.5
    assert list(traj.prompt_ids) == list(prompt(tokenizer).prompt_ids)
    s = traj.samples[0]
    assert len(s.output_ids) == len(s.logprobs) == len(s.versions) and s.output_ids[-1] == tokenizer.eos_token_id
    assert Trajectory.from_msg(traj.to_msg()).samples[1].reward == -2.0


def test_single_step_agent_drops_groups_outside_the_success_rate_bounds(tokenizer):
    right, wrong = " #### 7", " #### 3"
    all_right = AgentConfig(success_rate_ub=0.75)
    assert run_agent(all_right, tokenizer, [right] * 4, 4)[0] is None  # 1.0 > 0.75
    assert run_agent(all_right, tokenizer, [right] * 3 + [wrong], 4)[0] is not None  # 0.75 is not > 0.75
    all_wrong = AgentConfig(success_rate_lb=0.25)
    assert run_agent(all_wrong, tokenizer, [wrong] * 4, 4)[0] is None  # 0.0 < 0.25
    assert run_agent(all_wrong, tokenizer, [right] + [wrong] * 3, 4)[0] is not None  # 0.25 is not < 0.25


def test_multi_turn_agent_puts_feedback_tokens_in_the_output_with_loss_mask_zero(tokenizer):
    cfg = AgentConfig(type="math-multi-turn", num_turns=3, turn_level_discount=0.5)
    # One sample: wrong, wrong, right.
    traj, client = run_agent(cfg, tokenizer, [" #### 1", " #### 2", " #### 7"], 1)
    (s,) = traj.samples
    fb = tokenizer(cfg.feedback, add_special_tokens=False)["input_ids"]
    answers = [tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
               for t in (" #### 1", " #### 2", " #### 7")]
    assert s.output_ids.tolist() == answers[0] + fb + answers[1] + fb + answers[2]
    assert s.mask().tolist() == [1] * len(answers[0]) + [0] * len(fb) + [1] * len(answers[1]) + [0] * len(fb) + [1] * len(answers[2])
    assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.mask()) if m == 0)
    assert s.reward == 1.0 * 0.5**2 and traj.metadata["turns"] == [3]
    # Each turn is generated from the prompt plus everything so far.
    p = list(prompt(tokenizer).prompt_ids)
    assert client.calls == [p, p + answers[0] + fb, p + answers[0] + fb + answers[1] + fb]
    assert traj.n_generated_tokens == sum(len(a) for a in answers)


def test_multi_turn_agent_stops_at_the_first_right_answer_and_at_num_turns(tokenizer):
    cfg = AgentConfig(type="math-multi-turn", num_turns=2)
    traj, client = run_agent(cfg, tokenizer, [" #### 7", " #### 1", " #### 2"], 2)
    assert [s.reward for s in traj.samples] == [1.0, -1.0] and traj.metadata["turns"] == [1, 2]
    assert len(client.calls) == 3


# ---- registries and user classes ------------------------------------------------------------------


class EchoAgent(Agent):
    """A user agent defined outside the package: one sample, reward = its own `bonus` argument."""

    def __init__(self, config, bonus: float = 0.0, **kw):
        super().__init__(config, **kw)
        self.bonus = bonus

    async def collect_trajectory(self, prompt, env, client):
        r = await client.generate(prompt.qid, prompt.prompt_ids, self.gconfig)
        _, reward, _, _ = await env.step(r.output_ids)
        from realhf.api.trajectory import Sample

        return Trajectory(prompt.qid, list(prompt.prompt_ids),
                          [Sample(r.output_ids, r.logprobs, r.versions, reward + self.bonus)])


class LengthEnv(Environment):
    """A user environment: reward = number of tokens in the action."""

    async def step(self, action):
        return None, float(len(action)), True, {}


def test_user_agent_and_environment_load_from_import_paths_with_their_args(tokenizer):
    agent_cfg = AgentConfig(type=f"{__name__}:EchoAgent", args={"bonus": 10.0})
    env_cfg = EnvConfig(type=f"{__name__}:LengthEnv")

    async def main():
        agent = make_agent(agent_cfg, gconfig=GenerationHyperparameters(), tokenizer=tokenizer)
        env = make_env(env_cfg)
        assert isinstance(agent, EchoAgent) and isinstance(env, LengthEnv)
        return await agent.collect_trajectory(prompt(tokenizer), env, ScriptedClient(tokenizer, ["abc"]))

    traj = asyncio.run(main())
    assert traj.samples[0].reward == len(traj.samples[0].output_ids) + 10.0


@register_agent("test-echo")
class RegisteredEcho(EchoAgent):
    pass


def test_registered_names_resolve_and_unknown_names_fail_with_the_choices():
    assert agent_class("test-echo") is RegisteredEcho
    assert agent_class("math-single-step").__name__ == "MathSingleStepAgent"
    with pytest.raises(ValueError, match="agent.type 'nope'.*math-multi-turn.*module.path:ClassName"):
        agent_class("nope")
    with pytest.raises(ValueError, match="not a subclass of realhf.api.agent.Agent"):
        agent_class(f"{__name__}:LengthEnv")
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.envs' for env.type"):
        make_env(EnvConfig(type="no_such_pkg.envs:Env"))
