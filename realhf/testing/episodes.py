"""One episode (or one prompt group) of a user's agent, outside a run: the rollout worker's own
steps (realhf.system.rollout.rollout_worker `_collect`) without the manager, the trainer and the
processes — the row checked as a dataset row, the prompt encoded with the agent's and the
environment's tools, `realhf.system.rollout.episode.run_group` (environments, rewards, the group filter,
the tokens), and the trajectory checked as the trainer would.

The result is the `Trajectory` a run would push (realhf.api.trajectory): `prompt_ids`, and per
sample `reward` (shaped as in a run), `metrics` (the agent's Outcome.info), `output_ids`,
`logprobs`, `versions`, `loss_mask`; `metadata["success_rate"]`. None when the agent dropped
every sample, or the group filter (`success_rate_lb/ub` of an AgentConfig) dropped the group.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Dict, Optional, Tuple, Union

from realhf.api.agent import Agent, agent_class, construct_agent
from realhf.api.arguments import check_arguments
from realhf.api.cli_args import AgentConfig, EnvConfig, GenerationHyperparameters
from realhf.api.env import NO_ENV, EnvFactory, Environment, env_class
from realhf.api.trajectory import Trajectory
from realhf.impl.dataset.prompt_dataset import parse_row
from realhf.impl.dataset.prompt_encoding import chat_template_on, encode_prompt
from realhf.system.rollout import episode
from realhf.system.rollout.openai_server import OpenAIServer, episode_endpoint
from realhf.testing.models import InProcessModel, ServerModel, load_tokenizer, model_dir


def run_episode(agent: Any, row: Dict[str, Any], **settings: Any) -> Optional[Trajectory]:
    """`run_group` with `group_size=1`: the trajectory of one sample."""
    return _sync(arun_group(agent, row, group_size=1, **settings), "run_episode")


def run_group(agent: Any, row: Dict[str, Any], **settings: Any) -> Optional[Trajectory]:
    """The agent run `group_size` times on `row`, concurrently, as a rollout worker runs it; see
    `arun_group` for the settings."""
    return _sync(arun_group(agent, row, **settings), "run_group")


async def arun_episode(agent: Any, row: Dict[str, Any], **settings: Any) -> Optional[Trajectory]:
    """`run_episode` inside a running event loop."""
    return await arun_group(agent, row, group_size=1, **settings)


async def arun_group(
    agent: Any,
    row: Dict[str, Any],
    *,
    group_size: int = 4,
    env: Any = None,
    model: Any = None,
    server: Optional[str] = None,
    tokenizer: Any = None,
    agent_args: Optional[Dict[str, Any]] = None,
    env_args: Optional[Dict[str, Any]] = None,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: Optional[int] = None,
    timeout: float = 60.0,
    chat_template: str = "auto",
) -> Optional[Trajectory]:
    """`run_group` inside a running event loop.

    agent: an Agent, or its class, registered name or import path (then constructed as in a run,
        `cls(config=..., tokenizer=..., **agent_args)`, its arguments checked as `rollout.agent.args`).
    env: the Environment's class, registered name, import path or EnvConfig (one is made per
        episode, `env_args` checked as `rollout.env.args`); None: no environment.
    model: 'tiny' (assets/tiny-math/sft), 'tiny-tools', a model directory or hub id — run by the
        native engine in this process — or any object with `generate` (a `ScriptedModel`).
    server: instead of model, the URL of a running server with POST /generate (built-in or SGLang).
    tokenizer: a tokenizer or its directory; default the model's (a server's from /get_model_info).
    max_new_tokens, temperature: the sampling of each `await gen()` (the agent may override them).
    seed: the in-process engine's sampler seed (default 1); a server samples with its own.
    timeout: seconds the whole group may take, and each generation call.
    chat_template: as `dataset.chat_template` ('auto', 'on', 'off').
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    # The arguments and the row are checked before a model loads.
    make_agent, agent_config = _agent(agent, agent_args)
    envs = _envs(env, env_args)
    fields = _row(row, envs)
    async with _opened(model, server, seed, group_size, timeout) as client:
        tok = load_tokenizer(tokenizer if tokenizer is not None else await _default_tokenizer(client))
        if isinstance(client, ServerModel):
            client.eos_token_id = getattr(tok, "eos_token_id", None)
        the_agent = make_agent(tok)
        try:
            tools = {**the_agent.tools, **await envs.tools()}
            schemas = [t.schema() for t in tools.values()] or None
            prompt = encode_prompt(tok, fields, chat_template_on(chat_template, tok), tools=schemas)
            qid = f"{fields['query_id']}@0"  # as a rollout worker names a group: query id @ epoch
            group = episode.run_group(
                the_agent,
                fields,
                prompt,
                qid=qid,
                client=client,
                envs=envs,
                gconfig=GenerationHyperparameters(max_new_tokens=max_new_tokens, temperature=temperature),
                tokenizer=tok,
                agent_config=agent_config,
                group_size=group_size,
                openai_endpoint=episode_endpoint,
            )
            try:
                traj = await asyncio.wait_for(group, timeout)
            except asyncio.TimeoutError:
                raise TimeoutError(_timed_out(agent_config.type, qid, group_size, timeout, client)) from None
        finally:
            await envs.aclose()
            await OpenAIServer.close_for_this_loop()
    problem = traj.problem() if traj is not None else None
    if problem is not None:
        raise episode.AgentError(f"agent {agent_config.type!r}: a run would not train on this group: {problem}")
    return traj


def _sync(coro, name: str):
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise RuntimeError(f"{name}() called inside a running event loop; use `await a{name}(...)` there")


@contextlib.asynccontextmanager
async def _opened(model: Any, server: Optional[str], seed: Optional[int], group_size: int, timeout: float):
    """The generation client for `model` or `server`, closed afterwards if made here."""
    if (model is None) == (server is None):
        raise ValueError("give one of model= ('tiny', a model directory, a ScriptedModel) or server= (a URL)")
    in_process = isinstance(model, str)
    if seed is not None and not in_process:
        raise ValueError(
            "seed= seeds the in-process engine (model='tiny' or a directory); a server or your own model samples with its own"
        )
    if server is not None:
        client = ServerModel(server, timeout=timeout)
    elif in_process:
        client = InProcessModel(model_dir(model), seed=1 if seed is None else seed, slots=group_size, timeout=timeout)
    else:
        if not callable(getattr(model, "generate", None)):
            raise TypeError(
                f"model={model!r}: expected a model name or directory, or an object with "
                "`async generate(qid, input_ids, gconfig, group_size)` (see realhf.testing.ScriptedModel)"
            )
        yield model  # the caller's: not ours to close
        return
    try:
        yield client
    finally:
        await client.close()


async def _default_tokenizer(client: Any) -> Any:
    if isinstance(client, InProcessModel):
        return client.path
    if isinstance(client, ServerModel):
        return await client.tokenizer_dir()
    if getattr(client, "tokenizer", None) is not None:  # a ScriptedModel's
        return client.tokenizer
    raise ValueError(f"pass tokenizer=: the model {type(client).__name__} names none")


def _class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _agent(agent: Any, args: Optional[Dict[str, Any]]) -> Tuple[Callable[[Any], Agent], AgentConfig]:
    """The agent's maker (given the tokenizer) and its AgentConfig (the group filter, reward
    shaping, its name)."""
    if isinstance(agent, Agent):
        if args:
            raise ValueError(
                "agent_args= is for an agent class or name, which run_episode constructs; this one is built"
            )
        config = agent.config if isinstance(agent.config, AgentConfig) else AgentConfig(type=_class_path(type(agent)))

        def built(tokenizer: Any) -> Agent:
            if agent.tokenizer is None:  # a run gives every agent the tokenizer; one built by hand may lack it
                agent.tokenizer = tokenizer
            return agent

        return built, config
    cls = agent_class(agent) if isinstance(agent, str) else agent
    if not (isinstance(cls, type) and issubclass(cls, Agent)):
        raise TypeError(f"agent={agent!r}: expected an Agent, or its class, registered name or import path")
    args = dict(args or {})
    check_arguments(cls, Agent, args, "agent_args")
    config = AgentConfig(type=agent if isinstance(agent, str) else _class_path(cls), args=args)
    return (lambda tokenizer: construct_agent(cls, config, tokenizer, args)), config


def _envs(env: Any, args: Optional[Dict[str, Any]]) -> EnvFactory:
    """The factory of the episodes' environments (shared resources opened at the first one)."""
    if isinstance(env, Environment):
        raise TypeError(
            f"env={env!r}: pass the environment's class (or name), not an instance: every episode gets "
            "a fresh one, cls(row, shared=..., config=..., **env_args)"
        )
    if isinstance(env, EnvConfig):
        if args:
            raise ValueError("env_args= with an EnvConfig: put the arguments in its `args`")
        config, cls = env, None
    elif env is None or env == NO_ENV:
        if args:
            raise ValueError("env_args= without env=")
        return EnvFactory(EnvConfig(type=NO_ENV))
    else:
        cls = env_class(env) if isinstance(env, str) else env
        if not (isinstance(cls, type) and issubclass(cls, Environment)):
            raise TypeError(f"env={env!r}: expected an Environment class, registered name or import path")
        config = EnvConfig(type=env if isinstance(env, str) else _class_path(cls), args=dict(args or {}))
    if config.type != NO_ENV:
        given = dict(config.args or {})
        check_arguments(cls or env_class(config.type), Environment, given, "env_args", ("__init__", "open_shared"))
    return EnvFactory(config, cls=cls)


def _row(row: Union[Dict[str, Any], Any], envs: EnvFactory) -> Dict[str, Any]:
    """The row as an agent gets it in a run, checked as a dataset row (a missing query_id is made up)."""
    if not isinstance(row, dict):
        raise TypeError(f"row must be a dict (a dataset row), got {type(row).__name__}")
    missing = [f for f in envs.required_fields if f not in row]
    if missing:
        raise ValueError(
            f"row lacks {missing}, which {envs.cls.__qualname__}.required_fields needs in every row; "
            f"the row's fields: {list(row)}"
        )
    return parse_row({"query_id": "row", **row}).as_dict()


def _timed_out(agent: str, qid: str, group_size: int, timeout: float, client: Any) -> str:
    waiting = getattr(client, "waiting", None)
    what = (
        ""
        if waiting is None
        else f"; {waiting} generation call(s) were waiting for {client.name}"
        if waiting
        else f"; no generation call was waiting for {client.name}: the agent or its environment was busy"
    )
    return (
        f"agent {agent!r}: the group of {group_size} episode(s) on qid {qid!r} did not finish within "
        f"timeout={timeout:g}s{what}"
    )
