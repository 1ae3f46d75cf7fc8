"""Running a user's Agent: the generation handle of one episode, and a prompt group of episodes.

`Gen` is what an agent's `run_episode(row, gen, env)` generates through. It holds the
episode's tokens — the prompt, then every generated and every appended token — and continues
from all of them on each call, so multi-turn episodes are concatenated at the token level:
nothing the model produced is ever decoded and re-encoded. Generated tokens carry loss and the
version of the weights that produced them; appended ones (feedback, tool results) carry no loss,
log-prob 0 and the version of the token before them. A generation interrupted by a weight update
is resumed by the client (partial rollout) without the agent noticing.

`run_group` runs the agent `group_size` times on one row (concurrently), each with its own
environment from the worker's `EnvFactory`, and turns the outcomes into the `Trajectory` the
rollout worker pushes: the group filter and reward shaping of `rollout.agent` applied. With
`one_request` (rollout.group_in_one_request) and an agent that generates once per episode
(`Agent.one_generation_per_episode`), the episodes' gen() calls wait for each other and go as one
request for the group (`GenerationClient.generate_group(one_request=True)`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from realhf.api.agent import Agent, Completion, Outcome, as_outcome, keep_group, shape_reward
from realhf.api.env import EnvFactory
from realhf.api.trajectory import Sample, Trajectory, metrics_problem
from realhf.impl.dataset.prompt_encoding import encode_prompt, has_chat_template, render_chat

Messages = List[Dict[str, Any]]
SAMPLING_FIELDS = ("max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids")


class AgentError(ValueError):
    """The agent used its generation handle in a way that cannot work (named in the message)."""


class Gen:
    """One episode's generation handle (see the module docstring)."""

    def __init__(
        self,
        client: Any,
        qid: str,
        prompt_ids: Sequence[int],
        gconfig: Any,
        tokenizer: Any,
        group_size: int = 1,
        openai_endpoint: Optional[Callable] = None,
        first_calls: Optional["GroupFirstCalls"] = None,
    ):
        self._client, self._qid, self._gconfig, self._group_size = client, qid, gconfig, group_size
        self._first_calls = first_calls
        self._openai_endpoint = openai_endpoint
        self.tokenizer = tokenizer
        self.prompt_ids: List[int] = list(prompt_ids)
        self.output_ids: List[int] = []
        self.logprobs: List[float] = []
        self.versions: List[int] = []
        self.loss_mask: List[int] = []
        self.no_eos = False
        self.n_calls = 0
        self.n_requests = 0

    def openai_endpoint(self, tokenizer: Any):
        """`async with gen.openai_endpoint(tokenizer) as (base_url, api_key)`: an OpenAI-compatible
        endpoint whose every call is generated through this episode (realhf.system.rollout.openai_server;
        the rollout worker provides it)."""
        if self._openai_endpoint is None:
            raise AgentError(
                "this episode has no OpenAI-compatible endpoint: run_group(openai_endpoint=...) was not given one"
            )
        return self._openai_endpoint(self, tokenizer)

    def set_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Start the episode from other tokens than the row's prompt (an agent that builds its own
        first request, e.g. through the OpenAI endpoint); only before anything was generated or
        appended. The samples of a group must still start from the same tokens."""
        if self.output_ids:
            raise AgentError("gen.set_prompt(): the episode already has tokens after its prompt")
        self.prompt_ids = list(prompt_ids)

    @property
    def ids(self) -> List[int]:
        """Every token of the episode so far: the prompt, then what was generated and appended."""
        return self.prompt_ids + self.output_ids

    async def __call__(self, **sampling: Any) -> Completion:
        """Generate from everything so far; `sampling` overrides rollout's gconfig for this call
        (max_new_tokens, temperature, top_p, top_k, min_new_tokens, stop_token_ids)."""
        unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
        if unknown:
            raise AgentError(f"gen(): unknown sampling option(s) {unknown}; choose from {list(SAMPLING_FIELDS)}")
        gconfig = dataclasses.replace(self._gconfig, **sampling) if sampling else self._gconfig
        input_ids = self.ids
        if self._first_calls is not None and self.n_calls == 0:
            r = await self._first_calls.generate(self, input_ids, gconfig)
        else:
            r = await self._client.generate(self._qid, input_ids, gconfig, self._group_size)
        self.output_ids += r.output_ids
        self.logprobs += r.logprobs
        self.versions += r.versions
        self.loss_mask += [1] * len(r.output_ids)
        self.no_eos = r.no_eos
        self.n_calls += 1
        self.n_requests += r.n_requests
        return Completion(
            output_ids=list(r.output_ids),
            logprobs=list(r.logprobs),
            versions=list(r.versions),
            text=self.tokenizer.decode(list(r.output_ids), skip_special_tokens=True),
            no_eos=r.no_eos,
            input_ids=input_ids,
        )

    def append(self, content: Union[str, Sequence[int], Messages]) -> List[int]:
        """Add tokens the model did not generate: a text (encoded without special tokens), token
        ids, or chat messages (rendered as the chat template continues a conversation, with the
        assistant's generation prompt after them). They carry no loss. Returns the ids added."""
        if isinstance(content, str):
            ids = list(self.tokenizer(content, add_special_tokens=False)["input_ids"])
        elif content and isinstance(content[0], dict):
            ids = self._continuation(list(content))
        else:
            ids = [int(t) for t in content]
        last_version = self.versions[-1] if self.versions else 0
        self.output_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [last_version] * len(ids)
        self.loss_mask += [0] * len(ids)
        return ids

    def _continuation(self, messages: Messages) -> List[int]:
        """The template's tokens for `messages` as they follow what the episode has: rendered after
        fixed earlier messages and cut after them, so the earlier turns are never re-rendered.
        After a reply the model ended with EOS, what the template puts between that EOS and the
        next message (ChatML: a newline) comes first."""
        if not has_chat_template(self.tokenizer):
            raise AgentError("gen.append(messages): the tokenizer has no chat template; append text or ids")
        after_reply = bool(self.loss_mask) and self.loss_mask[-1] == 1
        base = [{"role": "user", "content": "."}] + ([{"role": "assistant", "content": "."}] if after_reply else [])
        head = render_chat(self.tokenizer, base, add_generation_prompt=False)
        full = render_chat(self.tokenizer, base + messages, add_generation_prompt=True)
        if full[: len(head)] != head:
            raise AgentError(
                "gen.append(messages): the chat template renders earlier messages differently when "
                "more follow; append the turn as text instead"
            )
        ids = full[len(head) :]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if after_reply and eos is not None and self.output_ids[-1] == eos and eos in head:
            end = len(head) - 1 - head[::-1].index(eos)  # the template's own end of the assistant turn
            ids = head[end + 1 :] + ids
        return ids

    def sample(self, reward: float, metrics: Optional[Dict[str, float]] = None) -> Sample:
        return Sample(
            output_ids=self.output_ids,
            logprobs=self.logprobs,
            versions=self.versions,
            reward=reward,
            no_eos=self.no_eos,
            loss_mask=self.loss_mask,
            metrics=dict(metrics or {}),
        )


class GroupFirstCalls:
    """The first gen() call of each episode of a group, held until every episode made it (or
    ended without), then sent as one /generate with n samples when they all ask the same (prompt
    and sampling), else one by one."""

    def __init__(self, client: Any, qid: str, group_size: int):
        self._client, self._qid, self._group_size = client, qid, group_size
        self._expected = group_size
        self._seen: set = set()  # the Gens that joined or left
        self._calls: List[Tuple[List[int], Any, asyncio.Future]] = []
        self._task: Optional[asyncio.Task] = None

    async def generate(self, gen: Gen, input_ids: List[int], gconfig: Any):
        future = asyncio.get_running_loop().create_future()
        self._seen.add(id(gen))
        self._calls.append((list(input_ids), gconfig, future))
        self._maybe_send()
        return await future

    def leave(self, gen: Gen) -> None:
        """`gen`'s episode ended (or failed) without a call waiting here: wait for it no longer."""
        if id(gen) not in self._seen:
            self._seen.add(id(gen))
            self._expected -= 1
            self._maybe_send()

    def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _maybe_send(self) -> None:
        if self._task is None and self._calls and len(self._calls) >= self._expected:
            self._task = asyncio.ensure_future(self._send(self._calls))

    async def _send(self, calls) -> None:
        ids, gconfig = calls[0][0], calls[0][1]
        try:
            if len(calls) > 1 and all(c[0] == ids and c[1] == gconfig for c in calls):
                results = await self._client.generate_group(self._qid, ids, gconfig, len(calls), one_request=True)
            else:  # the episodes asked different things: each by itself
                results = await asyncio.gather(
                    *(self._client.generate(self._qid, c[0], c[1], self._group_size) for c in calls)
                )
        except asyncio.CancelledError:
            for _, _, future in calls:
                future.cancel()
            raise
        except Exception as e:
            for _, _, future in calls:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), r in zip(calls, results):
            if not future.done():
                future.set_result(r)


async def gather_or_cancel(coros) -> list:
    """Run concurrently; if one fails, cancel the others (and wait for them) before re-raising."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def episode_prompt(agent: Agent, envs: EnvFactory, tokenizer: Any, row: Dict[str, Any], chat: bool) -> List[int]:
    """The tokens an episode of `row` starts from: its prompt (chat template applied when `chat`)
    with the schemas of the agent's and the environment's tools."""
    tools = {**agent.tools, **await envs.tools()}
    schemas = [t.schema() for t in tools.values()] or None
    return encode_prompt(tokenizer, row, chat, tools=schemas)


async def run_episode(
    agent: Agent, agent_name: str, row: Dict[str, Any], gen: Gen, envs: EnvFactory
) -> Optional[Outcome]:
    """One episode: a fresh environment, reset, the agent, the environment closed in any case."""
    env = await envs.make(row)
    try:
        if env is not None:
            await env.reset()
        result = await agent.run_episode(row, gen, env)
    finally:
        if env is not None:
            await env.aclose()
    outcome = as_outcome(result, agent_name)
    if outcome is not None and gen.n_calls == 0:
        raise AgentError(f"agent {agent_name!r} returned a reward without generating anything (call `await gen()`)")
    return outcome


def _agent_metrics(outcome: Outcome, agent: str) -> Dict[str, float]:
    """The agent's Outcome.info as the sample's metrics (averaged per step into `agent/<name>`);
    anything but numbers is the agent's error, named."""
    bad = metrics_problem(outcome.info)
    if bad is not None:
        raise AgentError(f"agent {agent!r}: Outcome.info: {bad}")
    return {k: float(v) for k, v in outcome.info.items()}


async def run_group(
    agent: Agent,
    row: Dict[str, Any],
    prompt_ids: Sequence[int],
    *,
    qid: str,
    client: Any,
    envs: EnvFactory,
    gconfig: Any,
    tokenizer: Any,
    agent_config: Any,
    group_size: int,
    openai_endpoint: Optional[Callable] = None,
    one_request: bool = False,
) -> Optional[Trajectory]:
    """The agent run `group_size` times on `row`; the trajectory to push, or None when the
    group is filtered out (or every episode dropped its sample). `one_request`: the group's
    answers in one request when the agent generates once per episode (module docstring)."""
    birth = time.time()
    name = getattr(agent_config, "type", type(agent).__name__)
    first_calls = (
        GroupFirstCalls(client, qid, group_size)
        if one_request and group_size > 1 and getattr(agent, "one_generation_per_episode", False)
        else None
    )

    async def one() -> Tuple[Gen, Optional[Outcome]]:
        gen = Gen(client, qid, prompt_ids, gconfig, tokenizer, group_size, openai_endpoint, first_calls)
        try:
            return gen, await run_episode(agent, name, row, gen, envs)
        finally:
            if first_calls is not None:
                first_calls.leave(gen)

    try:
        done = await gather_or_cancel(one() for _ in range(group_size))
    finally:
        if first_calls is not None:
            first_calls.close()
    episodes = [(g, o) for g, o in done if o is not None]
    if not episodes:
        return None
    prompt_ids = episodes[0][0].prompt_ids
    if any(g.prompt_ids != prompt_ids for g, _ in episodes):
        raise AgentError(
            f"agent {name!r}: the episodes of one group started from different prompts; a group's "
            "samples must answer the same prompt"
        )
    successes = [o.succeeded for _, o in episodes]
    if not keep_group(successes, agent_config.success_rate_lb, agent_config.success_rate_ub):
        return None
    # rollout.agent.reward_bias is subtracted (what its config help says), the shaping adds: hence the sign.
    samples = [
        g.sample(
            shape_reward(o.reward, agent_config.reward_scaling, -agent_config.reward_bias), _agent_metrics(o, name)
        )
        for g, o in episodes
    ]
    return Trajectory(
        qid=qid,
        prompt_ids=list(prompt_ids),
        samples=samples,
        task=str(row.get("task", "")),
        birth_time=birth,
        metadata={
            "query_id": row.get("query_id"),
            "success_rate": sum(successes) / len(successes),
            "n_requests": sum(g.n_requests for g, _ in episodes),
            "gen_calls": [g.n_calls for g, _ in episodes],
        },
    )
