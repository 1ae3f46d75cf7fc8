"""The Agent / Environment API (per sample, per episode) and the built-in math agents.

The agents run through `realhf.system.rollout.episode.run_group` — what the rollout worker runs —
against the real `math` environment and the tiny-math tokenizer; generation is a scripted client
(the real client is specified in tests/unit/system/rollout/test_generation_client.py, and the whole path
in the system tests).
"""

import asyncio
from typing import List

import pytest

from helpers.chat_tokenizers import CHATML, tiny_tokenizer
from realhf.api.agent import Agent, Outcome, agent_class, keep_group, make_agent, register_agent, shape_reward
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import EnvFactory, Environment, env_class
from realhf.api.trajectory import Trajectory
from realhf.impl.dataset.prompt_encoding import PromptEncodingError, chat_template_on, encode_prompt
from realhf.system.rollout.episode import AgentError, Gen, run_group
from realhf.system.rollout.generation_client import GenerationResult

PROMPT = "Q: Max has 5 shells. He finds 2 more. How many shells does Max have now?\nA:"
ROW = {"query_id": "q", "prompt": PROMPT, "solutions": [" 5+2=7\n#### 7"], "task": "math", "difficulty": 3}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def chat_tokenizer():
    return tiny_tokenizer(CHATML)


class ScriptedClient:
    """Answers generate() calls with the next scripted text, as version-`version` tokens."""

    def __init__(self, tokenizer, texts: List[str], version: int = 0):
        self.tokenizer, self.texts, self.version = tokenizer, list(texts), version
        self.calls, self.gconfigs = [], []

    async def generate(self, qid, input_ids, gconfig, group_size=1, max_new_tokens=None):
        self.calls.append(list(input_ids))
        self.gconfigs.append(gconfig)
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.version += 1
        return GenerationResult(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop", 1)


def prompt_ids(tokenizer) -> List[int]:
    return encode_prompt(tokenizer, ROW, chat=False)


def run(config: AgentConfig, tokenizer, texts, group_size, env=None, row=ROW):
    env = env or EnvConfig()

    async def main():
        envs = EnvFactory(env)
        client = ScriptedClient(tokenizer, texts)
        try:
            traj = await run_group(
                make_agent(config, tokenizer=tokenizer),
                dict(row),
                prompt_ids(tokenizer),
                qid="q@0",
                client=client,
                envs=envs,
                gconfig=GenerationHyperparameters(),
                tokenizer=tokenizer,
                agent_config=config,
                group_size=group_size,
            )
            return traj, client
        finally:
            await envs.aclose()

    return asyncio.run(main())


# ---- rewards and the group filter ---------------------------------------------------------------


def test_reward_shaping_is_reward_minus_bias_times_scaling():
    assert shape_reward(1.0, 1.0, 0.0) == 1.0 and shape_reward(-1.0, 1.0, 0.0) == -1.0
    assert shape_reward(1.0, 5.0, -0.5) == 2.5 and shape_reward(-1.0, 5.0, -0.5) == -7.5
    assert shape_reward(-1.0, 5.0, -0.5, clip=4.0) == -4.0  # floats clip like tensors


def test_group_filter_bounds_are_strict():
    four = lambda k: [True] * k + [False] * (4 - k)  # noqa: E731 - k successes of 4
    assert keep_group(four(2), 0.5, 1.0) and not keep_group(four(1), 0.5, 1.0)  # 0.5 kept, 0.25 dropped
    assert keep_group(four(2), 0.0, 0.5) and not keep_group(four(3), 0.0, 0.5)  # 0.5 kept, 0.75 dropped
    assert keep_group(four(0), 0.0, 1.0) and keep_group(four(4), 0.0, 1.0)  # defaults keep everything


# ---- the built-in math agents -----------------------------------------------------------------------


def test_single_step_agent_grades_each_answer_and_the_framework_builds_the_trajectory(tokenizer):
    cfg = AgentConfig(type="math-single-step", reward_bias=0.0, reward_scaling=2.0)
    traj, client = run(cfg, tokenizer, [" 5+2=7\n#### 7", " 5+2=8\n#### 8", " #### 7", "no idea"], 4)
    assert sorted(s.reward for s in traj.samples) == [-2.0, -2.0, 2.0, 2.0]
    assert traj.qid == "q@0" and traj.metadata["query_id"] == "q" and traj.metadata["success_rate"] == 0.5
    assert list(traj.prompt_ids) == prompt_ids(tokenizer) and client.calls == [prompt_ids(tokenizer)] * 4
    s = traj.samples[0]
    assert len(s.output_ids) == len(s.logprobs) == len(s.versions) and s.output_ids[-1] == tokenizer.eos_token_id
    assert Trajectory.from_msg(traj.to_msg()).samples[1].reward == traj.samples[1].reward


@pytest.mark.system
def test_single_step_agent_grades_with_another_environment_and_passes_its_metrics_on(tokenizer):
    # The code task: the same agent, rollout.env.type=code; the env's info["metrics"] become the samples' metrics.
    row = {"query_id": "c", "prompt": "f('bc')='cb'\ndef f(x): return", "code_prefix": "def f(x): return"}
    row["tests"] = [["'bcg'", "'gcb'"], ["'q'", "'q'"]]
    cfg = AgentConfig(type="math-single-step")
    traj, _ = run(cfg, tokenizer, [" x[::-1]", " x", " x[::-1"], 3, env=EnvConfig(type="code"), row=row)
    assert [s.reward for s in traj.samples] == [1.0, -1.0, -1.0]
    assert [s.metrics["tests_passed"] for s in traj.samples] == [1.0, 0.5, 0.0]
    assert [s.metrics["syntax_error"] for s in traj.samples] == [0.0, 0.0, 1.0]


def test_single_step_agent_drops_groups_outside_the_success_rate_bounds(tokenizer):
    right, wrong = " #### 7", " #### 3"
    all_right = AgentConfig(success_rate_ub=0.75)
    assert run(all_right, tokenizer, [right] * 4, 4)[0] is None  # 1.0 > 0.75
    assert run(all_right, tokenizer, [right] * 3 + [wrong], 4)[0] is not None  # 0.75 is not > 0.75
    all_wrong = AgentConfig(success_rate_lb=0.25)
    assert run(all_wrong, tokenizer, [wrong] * 4, 4)[0] is None  # 0.0 < 0.25
    assert run(all_wrong, tokenizer, [right] + [wrong] * 3, 4)[0] is not None  # 0.25 is not < 0.25


def test_multi_turn_agent_concatenates_turns_at_the_token_level_with_feedback_off_the_loss(tokenizer):
    cfg = AgentConfig(type="math-multi-turn", num_turns=3, turn_level_discount=0.5)
    traj, client = run(cfg, tokenizer, [" #### 1", " #### 2", " #### 7"], 1)  # wrong, wrong, right
    (s,) = traj.samples
    fb = tokenizer(cfg.feedback, add_special_tokens=False)["input_ids"]
    answers = [
        tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for t in (" #### 1", " #### 2", " #### 7")
    ]
    assert s.output_ids.tolist() == answers[0] + fb + answers[1] + fb + answers[2]
    assert s.mask().tolist() == [1] * len(answers[0]) + [0] * len(fb) + [1] * len(answers[1]) + [0] * len(fb) + [
        1
    ] * len(answers[2])
    assert all(lp == 0.0 for lp, m in zip(s.logprobs, s.mask()) if m == 0)
    # Each generated token keeps the version that produced it (the client bumps it per call);
    # feedback tokens take the version of the answer before them.
    assert s.versions.tolist() == (
        [1] * len(answers[0]) + [1] * len(fb) + [2] * len(answers[1]) + [2] * len(fb) + [3] * len(answers[2])
    )
    assert s.reward == 1.0 * 0.5**2
    # Each turn is generated from the prompt plus everything so far, never re-encoded.
    p = prompt_ids(tokenizer)
    assert client.calls == [p, p + answers[0] + fb, p + answers[0] + fb + answers[1] + fb]
    assert traj.n_generated_tokens == sum(len(a) for a in answers)


def test_multi_turn_agent_stops_at_the_first_right_answer_and_at_num_turns(tokenizer):
    cfg = AgentConfig(type="math-multi-turn", num_turns=2)
    traj, client = run(cfg, tokenizer, [" #### 7", " #### 1", " #### 2"], 2)
    assert sorted(s.reward for s in traj.samples) == [-1.0, 1.0] and sorted(traj.metadata["gen_calls"]) == [1, 2]
    assert len(client.calls) == 3


# In a thread here; in its own process (the default) it starts one, so that case is a system test.
@pytest.mark.parametrize("isolation", ["thread", pytest.param("process", marks=pytest.mark.system)])
def test_reward_fn_grades_instead_of_an_environment(tokenizer, isolation):
    # reward_fn(prompt, completion, **row): every other field of the row arrives as a keyword.
    cfg = AgentConfig(reward_fn=f"{__name__}:ends_with_difficulty", reward_isolation=isolation)
    traj, _ = run(cfg, tokenizer, [" 3", " 4", " 3"], 3, env=EnvConfig(type="none"))
    assert sorted(s.reward for s in traj.samples) == [-1.0, 1.0, 1.0]
    traj, _ = run(
        AgentConfig(reward_fn=f"{__name__}:async_length"), tokenizer, [" 12345"], 1, env=EnvConfig(type="none")
    )
    assert traj.samples[0].reward == len(" 12345")


def ends_with_difficulty(prompt, completion, *, difficulty, solutions, **_):
    assert prompt == PROMPT and solutions == ROW["solutions"]
    return completion.strip().endswith(str(difficulty))


async def async_length(prompt, completion, **_):
    return float(len(completion))


# ---- a user's agent and environment ------------------------------------------------------------------


class CountingEnv(Environment):
    """A user environment: state per episode on self, one shared object per worker."""

    opened: List[dict] = []

    @classmethod
    def open_shared(cls, config, **kwargs):
        shared = {"episodes": 0, "closed": 0, "kwargs": kwargs}
        cls.opened.append(shared)
        return shared

    async def reset(self):
        self.shared["episodes"] += 1
        self.steps = 0

    async def step(self, action):
        self.steps += 1
        return None, float(self.steps), True, {}

    async def aclose(self):
        self.shared["closed"] += 1


class TwoStepAgent(Agent):
    """A user agent: two generations, the environment stepped twice, a row field in the reward."""

    def __init__(self, config, bonus: float = 0.0, **kw):
        super().__init__(config, **kw)
        self.bonus = bonus

    async def run_episode(self, row, gen, env):
        first = await gen(max_new_tokens=5)
        await env.step(first.text)
        gen.append(" and")
        second = await gen()
        _, reward, _, _ = await env.step(second.text)
        return reward + self.bonus + row["difficulty"]


def test_a_user_agent_and_environment_load_from_import_paths_with_their_args(tokenizer):
    agent_cfg = AgentConfig(type=f"{__name__}:TwoStepAgent", args={"bonus": 10.0})
    env_cfg = EnvConfig(type=f"{__name__}:CountingEnv", args={"pool": 2})
    CountingEnv.opened.clear()
    traj, client = run(agent_cfg, tokenizer, ["a", "b", "c", "d"], 2, env=env_cfg)
    # A fresh environment per episode (steps start at 0 in each), one shared object for both.
    assert [s.reward for s in traj.samples] == [2.0 + 10 + 3] * 2
    assert CountingEnv.opened == [{"episodes": 2, "closed": 2, "kwargs": {"pool": 2}}]
    assert client.gconfigs[0].max_new_tokens == 5 and client.gconfigs[1].max_new_tokens == 32


class RaisingAgent(Agent):
    async def run_episode(self, row, gen, env):
        await gen()
        raise RuntimeError("the agent broke")


class SlowAgent(Agent):
    cancelled = 0

    async def run_episode(self, row, gen, env):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            SlowAgent.cancelled += 1
            raise


class WrongTypeAgent(Agent):
    async def run_episode(self, row, gen, env):
        await gen()
        return "great"


class LazyAgent(Agent):
    async def run_episode(self, row, gen, env):
        return 1.0


class BadSamplingAgent(Agent):
    async def run_episode(self, row, gen, env):
        await gen(temprature=0.5)


@pytest.mark.parametrize(
    "agent, error",
    [
        ("RaisingAgent", "the agent broke"),
        ("WrongTypeAgent", "returned str; run_episode must return a reward"),
        ("LazyAgent", "returned a reward without generating anything"),
        ("BadSamplingAgent", r"unknown sampling option\(s\) \['temprature'\]"),
    ],
)
def test_an_agent_that_misbehaves_fails_its_group_with_a_clear_error_and_every_env_is_closed(tokenizer, agent, error):
    CountingEnv.opened.clear()
    with pytest.raises((RuntimeError, TypeError, AgentError), match=error):
        run(
            AgentConfig(type=f"{__name__}:{agent}"),
            tokenizer,
            ["a"] * 4,
            2,
            env=EnvConfig(type=f"{__name__}:CountingEnv"),
        )
    assert CountingEnv.opened[0]["closed"] == CountingEnv.opened[0]["episodes"] == 2


def test_one_failing_episode_cancels_the_rest_of_its_group(tokenizer):
    class Mixed(Agent):
        n = 0

        async def run_episode(self, row, gen, env):
            Mixed.n += 1
            if Mixed.n == 1:
                await asyncio.sleep(0.05)
                raise ValueError("first episode fails")
            await asyncio.sleep(30)

    async def main():
        envs = EnvFactory(EnvConfig(type="none"))
        await run_group(
            Mixed(AgentConfig()),
            ROW,
            [1],
            qid="q@0",
            client=None,
            envs=envs,
            gconfig=GenerationHyperparameters(),
            tokenizer=tokenizer,
            agent_config=AgentConfig(),
            group_size=3,
        )

    with pytest.raises(ValueError, match="first episode fails"):
        asyncio.run(asyncio.wait_for(main(), 5))  # not 30 s: the other two were cancelled


def test_none_drops_a_sample_and_an_all_dropped_group_is_not_pushed(tokenizer):
    class Picky(Agent):
        async def run_episode(self, row, gen, env):
            answer = await gen()
            return None if "skip" in answer.text else Outcome(0.5, success=True)

    async def main(texts):
        envs = EnvFactory(EnvConfig(type="none"))
        return await run_group(
            Picky(AgentConfig()),
            ROW,
            prompt_ids(tokenizer),
            qid="q@0",
            client=ScriptedClient(tokenizer, texts),
            envs=envs,
            gconfig=GenerationHyperparameters(),
            tokenizer=tokenizer,
            agent_config=AgentConfig(),
            group_size=3,
        )

    traj = asyncio.run(main(["skip", "ok", "ok"]))
    assert [s.reward for s in traj.samples] == [0.5, 0.5]
    assert asyncio.run(main(["skip"] * 3)) is None


def test_an_outcomes_numbers_reach_the_sample_and_anything_else_is_the_agents_error(tokenizer):
    class Counting(Agent):
        def __init__(self, config=None, *, note=None, **kwargs):
            super().__init__(config, **kwargs)
            self.note = note

        async def run_episode(self, row, gen, env):
            await gen()
            info = {"turns": 2, "solved": True} if self.note is None else {"note": self.note}
            return Outcome(1.0, info=info)

    async def main(agent):
        return await run_group(
            agent,
            ROW,
            prompt_ids(tokenizer),
            qid="q@0",
            client=ScriptedClient(tokenizer, ["a", "b"]),
            envs=EnvFactory(EnvConfig(type="none")),
            gconfig=GenerationHyperparameters(),
            tokenizer=tokenizer,
            agent_config=AgentConfig(type="counting"),
            group_size=2,
        )

    traj = asyncio.run(main(Counting(AgentConfig())))
    assert [s.metrics for s in traj.samples] == [{"turns": 2.0, "solved": 1.0}] * 2
    with pytest.raises(AgentError, match=r"agent 'counting': Outcome.info: note='hi' is not a finite number"):
        asyncio.run(main(Counting(AgentConfig(), note="hi")))


# ---- rows and chat ----------------------------------------------------------------------------------


def test_chat_template_is_applied_when_the_model_has_one(tokenizer, chat_tokenizer):
    assert not chat_template_on("auto", tokenizer) and chat_template_on("auto", chat_tokenizer)
    assert not chat_template_on("off", chat_tokenizer)
    with pytest.raises(PromptEncodingError, match="no chat template"):
        chat_template_on("on", tokenizer)
    rendered = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    assert (
        encode_prompt(chat_tokenizer, ROW, chat=True) == chat_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    )
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    row = {"query_id": "m", "messages": messages}
    text = chat_tokenizer.decode(encode_prompt(chat_tokenizer, row, chat=False))
    assert text.startswith("<|im_start|>system\nBe brief.") and text.endswith("<|im_start|>assistant\n")
    with pytest.raises(PromptEncodingError, match="row 'm' has chat 'messages' but the tokenizer has no chat template"):
        encode_prompt(tokenizer, row, chat=False)


def test_appended_messages_continue_the_conversation_without_re_rendering_earlier_turns(chat_tokenizer):
    gen = Gen(ScriptedClient(chat_tokenizer, ["4"]), "q@0", [1, 2, 3], GenerationHyperparameters(), chat_tokenizer)
    asyncio.run(gen())
    before = list(gen.output_ids)
    added = gen.append([{"role": "tool", "content": "result: 4"}])
    assert chat_tokenizer.decode(added) == "<|im_start|>tool\nresult: 4<|im_end|>\n<|im_start|>assistant\n"
    assert gen.output_ids == before + added and gen.loss_mask[-len(added) :] == [0] * len(added)


# ---- registries ------------------------------------------------------------------------------------------


@register_agent("test-two-step")
class RegisteredTwoStep(TwoStepAgent):
    pass


def test_registered_names_resolve_and_unknown_names_fail_with_the_choices():
    assert agent_class("test-two-step") is RegisteredTwoStep
    assert agent_class("math-single-step").__name__ == "MathSingleStepAgent"
    with pytest.raises(ValueError, match=r"rollout.agent.type='nope'.*math-multi-turn.*'path/to/file.py:Name'"):
        agent_class("nope")
    with pytest.raises(ValueError, match="rollout.agent.type='math-single-stop'.*did you mean 'math-single-step'"):
        agent_class("math-single-stop")
    with pytest.raises(ValueError, match="not a subclass of realhf.api.agent.Agent"):
        agent_class(f"{__name__}:CountingEnv")
    with pytest.raises(ValueError, match="rollout.env.type='no_such_pkg.envs:Env': no module 'no_such_pkg'"):
        env_class("no_such_pkg.envs:Env")


def test_after_a_reply_ended_by_eos_the_template_text_between_turns_comes_first(chat_tokenizer):
    # A template whose assistant turns end with the model's EOS token ("</s>" here, as
    # <|im_end|> is Qwen's) and a newline: the model generated the EOS, the newline is the template's.
    chat_tokenizer.chat_template = CHATML.replace("<|im_end|>", "</s>")
    gen = Gen(ScriptedClient(chat_tokenizer, ["4"]), "q@0", [1, 2, 3], GenerationHyperparameters(), chat_tokenizer)
    asyncio.run(gen())
    assert gen.output_ids[-1] == chat_tokenizer.eos_token_id
    added = gen.append([{"role": "tool", "content": "result: 4"}])
    assert chat_tokenizer.decode(added) == "\n<|im_start|>tool\nresult: 4</s>\n<|im_start|>assistant\n"
    # What the whole conversation would render to, from the generated reply on.
    whole = chat_tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "4"},
            {"role": "tool", "content": "result: 4"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert whole.endswith(chat_tokenizer.decode(gen.output_ids))


class PartialCredit(Agent):
    """An agent with an argument of its own, written as docs/your-agent.md shows."""

    def __init__(self, partial: float = 0.5, **kwargs):
        super().__init__(**kwargs)
        self.partial = partial

    async def run_episode(self, row, gen, env):
        return self.partial * (await gen()).text.count("7")


class NoSuper(Agent):
    def __init__(self, partial: float = 0.5, **kwargs):  # never calls the base's __init__
        self.partial = partial

    async def run_episode(self, row, gen, env):
        return 0.0


class NoKwargs(Agent):
    def __init__(self, partial: float = 0.5):
        self.partial = partial

    async def run_episode(self, row, gen, env):
        return 0.0


def test_an_agent_with_its_own_arguments_written_the_obvious_way_is_built_right(tokenizer):
    from realhf.testing import ScriptedModel, run_group

    cfg = AgentConfig(type=f"{__name__}:PartialCredit", args={"partial": 0.25})
    agent = make_agent(cfg, tokenizer=tokenizer)
    # The run's config and tokenizer reach the base class, the agent's own number its parameter.
    assert (agent.partial, agent.config, agent.tokenizer) == (0.25, cfg, tokenizer)
    assert agent.tools == {} and agent.tools is not Agent.tools
    # And in realhf.testing, where the issue was first met (a TypeError from AgentConfig * float).
    model = ScriptedModel([" 5+2=7\n#### 7", " 5+2=8"])
    traj = run_group(PartialCredit, ROW, agent_args={"partial": 0.25}, model=model, group_size=2)
    assert sorted(s.reward for s in traj.samples) == [0.0, 0.5]
    lazy = make_agent(AgentConfig(type=f"{__name__}:NoSuper"), tokenizer=tokenizer)
    assert lazy.config.type.endswith("NoSuper") and lazy.tokenizer is tokenizer  # set for it
    with pytest.raises(TypeError, match=r"take your own arguments as keywords and pass the rest on: def __init__"):
        make_agent(AgentConfig(type=f"{__name__}:NoKwargs"), tokenizer=tokenizer)
