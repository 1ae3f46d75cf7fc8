"""The OpenAI-compatible endpoint of an episode, driven by the real `openai` client against the
real aiohttp server; generation is scripted (the whole system runs it in
tests/system/e2e/test_agents.py)."""

import asyncio

import openai
import pytest

from helpers.chat_tokenizers import CHATML, tiny_tokenizer
from realhf.api.agent import make_agent
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import EnvFactory
from realhf.system.rollout.episode import Gen, run_group
from realhf.system.rollout.generation_client import GenerationResult
from realhf.system.rollout.openai_server import OpenAIServer, episode_endpoint


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer(CHATML)


class ScriptedModel:
    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls, self.gconfigs, self.version = tokenizer, list(texts), [], [], 0

    async def generate(self, qid, input_ids, gconfig, group_size=1):
        self.calls.append(list(input_ids))
        self.gconfigs.append(gconfig)
        self.version += 1
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return GenerationResult(ids, [-0.25] * len(ids), [self.version] * len(ids), "stop", 1)


def in_episode(tokenizer, texts, workflow):
    """Run `workflow(client, gen)` against a served episode; returns (result, gen, model)."""
    model = ScriptedModel(tokenizer, texts)

    async def main():
        server = await OpenAIServer.for_this_loop()
        gen = Gen(model, "q@0", [], GenerationHyperparameters(), tokenizer)
        try:
            with server.episode(gen, tokenizer) as (base_url, key):
                client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=10)
                try:
                    return await workflow(client, gen), gen
                finally:
                    await client.close()
        finally:
            await server.close()

    result, gen = asyncio.run(main())
    return result, gen, model


@pytest.mark.system
def test_a_conversation_of_two_requests_is_one_sample_at_the_token_level(tokenizer):
    async def workflow(client, gen):
        messages = [{"role": "user", "content": "5+2?"}]
        first = await client.chat.completions.create(model="realhf", messages=messages, temperature=0.5, max_tokens=9)
        messages += [first.choices[0].message, {"role": "user", "content": "Sure?"}]
        second = await client.chat.completions.create(model="realhf", messages=messages)
        return first, second

    (first, second), gen, model = in_episode(tokenizer, ["7", "Yes, 7"], workflow)
    assert first.choices[0].message.content == "7" and second.choices[0].message.content == "Yes, 7"
    assert first.choices[0].finish_reason == "stop" and first.usage.completion_tokens == 2
    assert model.gconfigs[0].temperature == 0.5 and model.gconfigs[0].max_new_tokens == 9
    prompt = tokenizer.decode(gen.prompt_ids)
    assert prompt == "<|im_start|>user\n5+2?<|im_end|>\n<|im_start|>assistant\n"
    # The reply's tokens are the generated ones (EOS included); the new user turn is appended,
    # off the loss; the second request continued from all of it.
    eos = tokenizer.eos_token_id
    seven = tokenizer("7", add_special_tokens=False)["input_ids"] + [eos]
    turn = tokenizer("<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]
    assert gen.output_ids[: len(seven) + len(turn)] == seven + turn
    assert gen.loss_mask[: len(seven) + len(turn)] == [1] * len(seven) + [0] * len(turn)
    assert model.calls[1] == gen.prompt_ids + seven + turn
    assert gen.versions[-1] == 2 and gen.versions[0] == 1


def test_a_request_that_rewrites_history_is_refused_and_a_wrong_key_too(tokenizer):
    async def workflow(client, gen):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "5+2?"}])
        errors = []
        for messages in (
            [{"role": "user", "content": "6+2?"}, {"role": "user", "content": "x"}],
            [{"role": "user", "content": "5+2?"}],
        ):
            try:
                await client.chat.completions.create(model="m", messages=messages)
            except openai.BadRequestError as e:
                errors.append(str(e))
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], n=2)
        except openai.BadRequestError as e:
            errors.append(str(e))
        bad = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0)
        try:
            await bad.models.list()
        except openai.AuthenticationError as e:
            errors.append(str(e))
        finally:
            await bad.close()
        return errors

    errors, gen, model = in_episode(tokenizer, ["7"], workflow)
    assert len(errors) == 4 and len(model.calls) == 1
    assert all("do not extend this episode's conversation" in e for e in errors[:2])
    assert "n must be 1" in errors[2] and "the episode's key" in errors[3]


def test_tool_calls_come_back_as_openai_tool_calls(tokenizer):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "5+2"}}</tool_call>'

    async def workflow(client, gen):
        messages = [{"role": "user", "content": "5+2?"}]
        reply = await client.chat.completions.create(model="m", messages=messages)
        message = reply.choices[0].message
        (tc,) = message.tool_calls
        messages += [message, {"role": "tool", "tool_call_id": tc.id, "content": "7"}]
        final = await client.chat.completions.create(model="m", messages=messages)
        return reply, tc, final

    (reply, tc, final), gen, _ = in_episode(tokenizer, [call, "#### 7"], workflow)
    assert reply.choices[0].finish_reason == "tool_calls" and reply.choices[0].message.content is None
    assert tc.function.name == "calculator" and tc.function.arguments == '{"expression": "5+2"}'
    assert final.choices[0].message.content == "#### 7"
    assert "<|im_start|>tool\n7<|im_end|>" in tokenizer.decode(gen.output_ids)


def test_the_openai_agent_turns_a_workflow_into_a_trained_sample(tokenizer):
    config = AgentConfig(type="openai-agent", args={"workflow": "helpers.user_agents:openai_math"})
    agent = make_agent(config, tokenizer=tokenizer)
    row = {"query_id": "q", "prompt": "Q: 5+2?\nA:", "solutions": [" 5+2=7\n#### 7"]}

    async def main():
        envs = EnvFactory(EnvConfig(type="none"))
        try:
            return await run_group(
                agent,
                row,
                [0],
                qid="q@0",
                client=ScriptedModel(tokenizer, [" #### 7", " #### 8"]),
                envs=envs,
                gconfig=GenerationHyperparameters(),
                tokenizer=tokenizer,
                openai_endpoint=episode_endpoint,
                agent_config=config,
                group_size=2,
            )
        finally:
            server = await OpenAIServer.for_this_loop()
            await server.close()

    traj = asyncio.run(main())
    assert sorted(s.reward for s in traj.samples) == [-1.0, 1.0]
    # The group's prompt is what the workflow's first request rendered, not the row's encoding.
    assert tokenizer.decode(list(traj.prompt_ids)).startswith("<|im_start|>user\nQ: 5+2?")
