"""realhf.testing: one episode or group of a user's agent, on the embedded tiny model in this
process or on a running built-in server over loopback HTTP, as a rollout worker runs it."""

import asyncio
import os

import pytest
from transformers import AutoTokenizer

from helpers.fake_sglang import FakeSGLangServer
from helpers.paths import TINY_MATH
from realhf.api.agent import Agent, Outcome
from realhf.api.cli_args import AgentConfig
from realhf.api.env import Environment
from realhf.system.rollout.episode import AgentError
from realhf.testing import ScriptedModel, arun_episode, run_episode, run_group

SFT = os.path.join(TINY_MATH, "sft")
ROW = {"query_id": "q7", "prompt": "Q: Max has 5 shells. He finds 2 more. How many?\nA:", "solutions": [" #### 7"]}


class Answer(Agent):
    """One answer, graded by the environment; its length as a metric."""

    def __init__(self, config=None, *, tokenizer=None, bonus: float = 0.0, **kwargs):
        super().__init__(config, tokenizer=tokenizer, **kwargs)
        self.bonus = bonus

    async def run_episode(self, row, gen, env):
        answer = await gen()
        _, reward, _, _ = await env.step(answer.text)
        return Outcome(reward + self.bonus, info={"length": len(answer.output_ids)})


class LastNumber(Environment):
    required_fields = ("solutions",)

    async def step(self, action):
        right = action.strip().split("####")[-1].strip() == self.row["solutions"][0].split("####")[-1].strip()
        return None, 1.0 if right else -1.0, True, {}


@pytest.fixture(scope="module")
def native_server_model():
    """The built-in server on the embedded tiny model (its tokenizer found through /get_model_info)."""
    return SFT, 256, 8


def test_an_episode_on_the_tiny_model_in_process_returns_its_reward_and_tokens():
    out = run_episode(Answer, ROW, env=LastNumber, model="tiny", max_new_tokens=24)
    (s,) = out.samples
    tokenizer = AutoTokenizer.from_pretrained(SFT)
    assert out.prompt_ids.tolist() == tokenizer(ROW["prompt"], add_special_tokens=False)["input_ids"]
    assert s.reward in (1.0, -1.0) and s.metrics == {"length": len(s.output_ids)}
    assert 0 < len(s.output_ids) <= 24 and len(s.logprobs) == len(s.versions) == len(s.output_ids)
    assert (s.logprobs <= 0).all() and set(s.versions.tolist()) == {0} and s.mask().all()
    assert out.metadata["success_rate"] == (s.reward > 0)


def test_the_same_seed_repeats_an_episode_and_another_seed_samples_anew():
    def answer(seed):
        return run_episode(Answer, ROW, env=LastNumber, model="tiny", seed=seed).samples[0].output_ids.tolist()

    runs = [answer(1), answer(1), *(answer(s) for s in range(2, 6))]
    assert runs[0] == runs[1] and any(r != runs[0] for r in runs[2:])


@pytest.mark.system
def test_a_group_on_a_running_built_in_server_over_http(native_server):
    url, engine = native_server
    group = run_group(Answer, ROW, env=LastNumber, server=url, group_size=3, max_new_tokens=16)
    assert len(group.samples) == 3 and group.metadata["n_requests"] == 3
    for s in group.samples:
        assert 0 < len(s.output_ids) <= 16 and set(s.versions.tolist()) == {engine.weight_version}
        assert len(s.logprobs) == len(s.output_ids) and (s.logprobs <= 0).all()
    with pytest.raises(ValueError, match="seed= seeds the in-process engine"):
        run_episode(Answer, ROW, env=LastNumber, server=url, seed=3)


def test_an_sglang_compatible_server_that_aborts_answers_is_resubmitted_with_the_tokens_so_far():
    with FakeSGLangServer(abort_after=3, weight_version=4) as fake:  # no /get_model_info: tokenizer= given
        out = run_episode(Answer, ROW, env=LastNumber, server=fake.url, tokenizer="tiny", max_new_tokens=10)
    (s,) = out.samples
    assert len(s.output_ids) == 10 and s.no_eos and set(s.versions.tolist()) == {4}
    assert out.metadata["n_requests"] == 4  # 3 + 3 + 3 + 1 tokens


def test_agent_and_environment_arguments_are_checked_as_in_a_run():
    with pytest.raises(ValueError, match=r"agent_args\.bonsu \(did you mean agent_args\.bonus\?\)"):
        run_episode(Answer, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]), agent_args={"bonsu": 1})
    out = run_episode(Answer, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]), agent_args={"bonus": 0.5})
    assert out.samples[0].reward == 1.5
    with pytest.raises(ValueError, match=r"env_args\.strict: not an argument"):
        run_episode(Answer, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]), env_args={"strict": True})
    with pytest.raises(TypeError, match="pass the environment's class"):
        run_episode(Answer, ROW, env=LastNumber(ROW), model=ScriptedModel([" #### 7"]))
    with pytest.raises(ValueError, match=r"lacks \['solutions'\], which LastNumber.required_fields needs"):
        run_episode(Answer, {"prompt": "Q: 1+1?\nA:"}, env=LastNumber, model=ScriptedModel([" #### 2"]))


def test_a_built_agent_keeps_its_config_so_reward_shaping_applies():
    agent = Answer(AgentConfig(type="answer", reward_scaling=2.0, reward_bias=0.5))
    out = run_episode(agent, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]))
    assert out.samples[0].reward == (1.0 - 0.5) * 2.0
    assert agent.tokenizer is not None  # given the episode's, as a run gives every agent one


def test_a_stuck_environment_times_out_naming_what_was_waiting():
    class Stuck(LastNumber):
        async def step(self, action):
            await asyncio.sleep(30)

    with pytest.raises(TimeoutError, match="no generation call was waiting .* the agent or its environment was busy"):
        run_episode(Answer, ROW, env=Stuck, model="tiny", timeout=0.5)


def test_a_group_the_trainer_would_refuse_fails_here():
    class NaN(Answer):
        async def run_episode(self, row, gen, env):
            await gen()
            return float("nan")

    with pytest.raises(AgentError, match="a run would not train on this group: samples\\[0\\].reward is nan"):
        run_episode(NaN, ROW, model=ScriptedModel([" #### 7"]))


def test_inside_an_event_loop_the_async_form_is_asked_for():
    async def main():
        with pytest.raises(RuntimeError, match=r"use `await arun_episode\(\.\.\.\)`"):
            run_episode(Answer, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]))
        return await arun_episode(Answer, ROW, env=LastNumber, model=ScriptedModel([" #### 7"]))

    assert asyncio.run(main()).samples[0].reward == 1.0
