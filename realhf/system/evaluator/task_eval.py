"""Evaluation through the task: the configured agent and environment on held-out rows, answering
with an engine in this process. The evaluator (realhf/system/evaluator/evaluator_worker.py) runs it on
each due version, training/main_async_ppo.py before and after training.

    task = TaskEval(cfg, engine, rows)          # cfg: an EvaluatorConfig
    result = task.run(temperature=0.0, k=1)     # greedy; k > 1 answers per row at a temperature

Each episode runs as a rollout worker runs it (realhf.system.rollout.episode: the row's prompt with the
tools' schemas, a fresh environment, the agent's `run_episode`, the environment closed), the same
agent and environment classes and args (`rollout.agent`, `rollout.env`), but with the
evaluation's sampling: `ppo.gen` at the given temperature, `evaluation.max_new_tokens` per call,
top-p and top-k off (pure sampling, as the accuracy has always been measured). There is no group
filter and no reward shaping: the numbers are the agent's own.

    accuracy     the success rate: `Outcome.succeeded` (the agent's `success`, else reward > 0 —
                 the rule of the training metric `success_rate`); a failed episode counts as unsuccessful
    reward_mean  the agent's reward, before rollout.agent.reward_scaling / reward_bias
    pass_at_k    rows with a success among their k answers
    metrics      the mean of each number the agents put in `Outcome.info` (training logs them as `agent/<name>`)

For the built-in math task the environment's grade is the accuracy: a right final answer (and,
with `rollout.env.check_work`, right worked lines; the final answer alone is `metrics["answer_right"]`).
An episode that raises is counted (`failed`) and the evaluation goes on, as a rollout worker goes
on; one that returns None is left out (`dropped`). An engine that stops or does not answer fails
the evaluation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from realhf.api.agent import Outcome, make_agent
from realhf.api.env import EnvFactory
from realhf.api.prompt import PromptRow
from realhf.api.worker_configs import EvaluatorConfig
from realhf.base import logging
from realhf.system.evaluator.pass_at_k import pass_at_k
from realhf.system.rollout.engine_client import EngineGenerationClient
from realhf.system.rollout.episode import Gen, episode_prompt, gather_or_cancel, run_episode

logger = logging.getLogger("task_eval")


class EvaluationError(RuntimeError):
    """Nothing could be measured: every episode failed or was dropped."""


def eval_rows_advice(env_type: str, required: Sequence[str], agent_type: str) -> str:
    """What to tell a user whose held-out rows the task cannot evaluate."""
    need = f"the fields {list(required)} and " if required else ""
    return (
        f"evaluation runs rollout.agent.type={agent_type} with rollout.env.type={env_type} on the rows of "
        f"dataset.test_path, so each row needs {need}a prompt (or messages): point dataset.test_path at held-out "
        "rows of the training task, or turn evaluation off with evaluation.n_prompts=0 (before and after "
        "training) and exp_ctrl.eval_freq_steps=0 (during training)"
    )


def load_eval_rows(cfg: EvaluatorConfig, n_prompts: int) -> List[PromptRow]:
    """The first `n_prompts` rows of the held-out file (fewer when it has fewer), with the fields
    the environment needs; a ValueError naming the fix when the task cannot evaluate them."""
    from realhf.impl.dataset.prompt_dataset import DatasetFormatError, load_prompts

    required = EnvFactory(cfg.env).required_fields
    try:
        rows = load_prompts(
            cfg.test_path, required=required, columns=cfg.columns, split=cfg.test_split, config_name=cfg.config_name
        )
    except (DatasetFormatError, FileNotFoundError) as e:
        raise ValueError(
            f"dataset.test_path: {e}; {eval_rows_advice(cfg.env.type, required, cfg.agent.type)}"
        ) from None
    return rows[:n_prompts]


def eval_gconfig(cfg: EvaluatorConfig, temperature: float) -> Any:
    """The sampling of evaluation episodes (see the module docstring)."""
    return dataclasses.replace(
        cfg.gconfig, temperature=float(temperature), max_new_tokens=cfg.max_new_tokens, top_p=1.0, top_k=-1
    )


@dataclass
class Episode:
    outcome: Optional[Outcome] = None  # None: dropped by the agent, or failed
    new_tokens: int = 0  # tokens the model generated (appended ones not counted)
    truncated: bool = False  # the last answer hit its token budget without EOS
    error: str = ""  # why it failed; empty if it did not


def summarize(per_row: Sequence[Sequence[Episode]], temperature: float) -> Dict[str, Any]:
    """The result of one evaluation from the episodes of each row (module docstring)."""
    episodes = [e for row in per_row for e in row]
    scored = [e for e in episodes if e.outcome is not None]
    failed = [e for e in episodes if e.error]
    if not scored:
        why = f"{len(failed)} failed (first: {failed[0].error})" if failed else "the agent dropped every sample"
        raise EvaluationError(f"no evaluation episode of {len(episodes)} gave a reward: {why}")
    counted = len(scored) + len(failed)
    successes = [sum(e.outcome is not None and e.outcome.succeeded for e in row) for row in per_row]
    info: Dict[str, List[float]] = {}
    for e in scored:
        for key, value in e.outcome.info.items():
            if isinstance(value, (int, float)):
                info.setdefault(key, []).append(float(value))
    rewards = sorted(e.outcome.reward for e in scored)
    # Prompts whose answers all got the same reward (2+ answers each): nothing to learn there.
    spread = [len({e.outcome.reward for e in row if e.outcome is not None}) for row in per_row]
    multi = [n for row, n in zip(per_row, spread) if sum(e.outcome is not None for e in row) > 1]
    return {
        "accuracy": sum(successes) / counted,
        "reward_mean": sum(rewards) / len(rewards),
        # The distribution beside the mean: a success rate of 0 with rewards that differ can
        # still be learnt from; one reward for every answer cannot.
        "reward_quantiles": [rewards[round(q * (len(rewards) - 1))] for q in (0.0, 0.25, 0.5, 0.75, 1.0)],
        "frac_reward_zero_std": sum(n == 1 for n in multi) / len(multi) if multi else None,
        "pass_at_k": pass_at_k(successes),
        "k": max(len(row) for row in per_row),
        "n_prompts": len(per_row),
        "n": len(episodes),
        "failed": len(failed),
        "dropped": len(episodes) - counted,
        "temperature": temperature,
        "mean_new_tokens": sum(e.new_tokens for e in episodes) / len(episodes),
        "truncated": sum(e.truncated for e in episodes) / len(episodes),
        "metrics": {key: sum(v) / len(v) for key, v in info.items()},
    }


class TaskEval:
    """The task's episodes on `rows` against a started `engine` (module docstring). One event
    loop of its own, run by whichever thread calls `run` (one at a time)."""

    def __init__(self, cfg: EvaluatorConfig, engine: Any, rows: Sequence[PromptRow]):
        from realhf.impl.dataset.prompt_encoding import chat_template_on
        from realhf.impl.dataset.tokenizer_loading import load_tokenizer

        if not rows:
            raise ValueError(f"dataset.test_path={cfg.test_path!r}: no held-out rows to evaluate")
        self.cfg, self.rows = cfg, list(rows)
        self.tokenizer = load_tokenizer(cfg.model_path)
        self.chat = chat_template_on(cfg.chat_template, self.tokenizer)
        self.agent = make_agent(cfg.agent, tokenizer=self.tokenizer)
        self.envs = EnvFactory(cfg.env)
        self.client = EngineGenerationClient(engine, answer_timeout=cfg.answer_timeout)
        # Enough episodes at once to keep every engine slot busy while others are in the environment.
        self.concurrency = 2 * max(1, int(getattr(engine, "n_slots", cfg.batch_size)))
        self._prompts: Optional[List[List[int]]] = None
        self._loop = asyncio.new_event_loop()

    def run(self, temperature: float, k: int = 1) -> Dict[str, Any]:
        """`k` episodes per row at `temperature` (0: greedy); the result of `summarize`."""
        if k < 1:
            raise ValueError(f"answers per prompt must be >= 1, got {k}")
        try:
            return self._loop.run_until_complete(self._run(float(temperature), k))
        except BaseException:  # KeyboardInterrupt, the launcher's stop: end every episode first
            self._cancel_episodes()
            raise

    def _cancel_episodes(self) -> None:
        """Cancel the episodes still running and let them unwind, so that none is destroyed
        pending (asyncio logs each) and none is left waiting on the grader's pool."""
        tasks = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks and not self._loop.is_running():
            self._loop.run_until_complete(asyncio.wait(tasks, timeout=5.0))

    async def _run(self, temperature: float, k: int) -> Dict[str, Any]:
        self.client.broken = None
        if self._prompts is None:  # the tools' schemas are known once the environment's shared part opened
            self._prompts = [
                await episode_prompt(self.agent, self.envs, self.tokenizer, r.as_dict(), self.chat) for r in self.rows
            ]
        gconfig = eval_gconfig(self.cfg, temperature)
        slots = asyncio.Semaphore(self.concurrency)

        async def one(i: int) -> Episode:
            async with slots:
                return await self._episode(i, gconfig, k)

        done = await gather_or_cancel(one(i) for i in range(len(self.rows)) for _ in range(k))
        result = summarize([done[i * k : (i + 1) * k] for i in range(len(self.rows))], temperature)
        errors = [e.error for e in done if e.error]
        if errors:
            logger.warning(
                f"{len(errors)} of {len(done)} evaluation episodes failed (counted unsuccessful); first: {errors[0]}"
            )
        return result

    async def _episode(self, i: int, gconfig: Any, k: int) -> Episode:
        from realhf.system.rollout.openai_server import episode_endpoint

        row = self.rows[i]
        cfg = self.cfg
        gen = Gen(self.client, f"eval-{row.query_id}", self._prompts[i], gconfig, self.tokenizer, k, episode_endpoint)
        episode = run_episode(self.agent, cfg.agent.type, row.as_dict(), gen, self.envs)
        try:
            if cfg.episode_timeout > 0:
                outcome = await asyncio.wait_for(episode, cfg.episode_timeout)
            else:
                outcome = await episode
            error = ""
        except Exception as e:  # noqa: BLE001 - the agent's failure is counted; the engine's fails the evaluation
            if self.client.broken is not None:
                raise self.client.broken from None
            outcome = None
            if isinstance(e, asyncio.TimeoutError):
                error = f"{row.source}: ran longer than rollout.episode_timeout={cfg.episode_timeout:g}s"
            else:
                error = f"{row.source}: {type(e).__name__}: {e}"
        return Episode(outcome, sum(gen.loss_mask), gen.no_eos, error)

    def close(self, wait: float = 2.0) -> None:
        """Release what the environment's episodes share; an evaluation still running in another
        thread (its engine stopped) gets `wait` seconds to end first."""
        deadline = time.monotonic() + wait
        while self._loop.is_running() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self._loop.is_running() or self._loop.is_closed():
            return  # a daemon thread still in it: the process exit ends it

        async def shutdown():
            from realhf.system.rollout.openai_server import OpenAIServer

            await self.envs.aclose()
            await OpenAIServer.close_for_this_loop()

        try:
            self._loop.run_until_complete(shutdown())
        finally:
            self._loop.close()


def evaluate_weights(
    cfg: EvaluatorConfig, weights: str, runs: Sequence[Tuple[float, int]], n_prompts: int
) -> List[dict]:
    """Start an engine on `weights` (an HF directory) in this process, run `TaskEval` once per
    (temperature, k) of `runs` on the first `n_prompts` held-out rows, stop it."""
    from realhf.base.device import pick_device
    from realhf.impl.inference.factory import create_engine_from_config

    rows = load_eval_rows(cfg, n_prompts)
    native = dataclasses.replace(cfg.native, n_threads=cfg.n_threads, max_running_requests=cfg.batch_size)
    engine = create_engine_from_config(
        weights, native, seed=cfg.seed, name="evaluation", device=pick_device(cfg.device)
    ).start()
    task = None
    try:
        task = TaskEval(dataclasses.replace(cfg, model_path=weights), engine, rows)
        return [task.run(temperature, k) for temperature, k in runs]
    finally:
        engine.stop(timeout=2.0)
        if task is not None:
            task.close()


QUANTILE_NAMES = ("min", "p25", "p50", "p75", "max")


def eval_row(version: int, result: Dict[str, Any], seconds: float, trainer_version: int, skipped: List[int]) -> dict:
    """One `eval_metrics.jsonl` row (step = version); `eval/accuracy` is the success rate."""
    row = {
        "step": version,
        "version": version,
        "time": time.time(),
        "eval/accuracy": result["accuracy"],
        "eval/reward_mean": result["reward_mean"],
        **{f"eval/reward_{name}": q for name, q in zip(QUANTILE_NAMES, result["reward_quantiles"])},
        "eval/pass_at_k": result["pass_at_k"],
        **(
            {"eval/frac_reward_zero_std": result["frac_reward_zero_std"]}
            if result["frac_reward_zero_std"] is not None
            else {}
        ),
        "eval/k": result["k"],
        "eval/n_prompts": result["n_prompts"],
        "eval/failed": result["failed"],
        "eval/dropped": result["dropped"],
        "eval/temperature": result["temperature"],
        "eval/mean_new_tokens": result["mean_new_tokens"],
        "eval/truncated": result["truncated"],
        "eval/seconds": seconds,
        "eval/trainer_version": trainer_version,
        "eval/skipped": list(skipped),
    }
    row.update({f"eval/agent/{key}": value for key, value in result["metrics"].items()})
    return row


def eval_line(row: dict) -> str:
    """The log line of an evaluation row."""
    v, k = row["version"], row["eval/k"]
    extra = "".join(
        f", {key[len('eval/') :]} {value:.3f}" for key, value in row.items() if key.startswith("eval/agent/")
    )
    failed = f", {row['eval/failed']} episodes failed" if row["eval/failed"] else ""
    frac = row.get("eval/frac_reward_zero_std")
    spread = f", {frac:.0%} of prompts with one reward for all answers" if frac is not None else ""
    return (
        f"evaluated version {v} (step {v}): accuracy {row['eval/accuracy']:.3f}, pass@{k} {row['eval/pass_at_k']:.3f}, "
        f"mean reward {row['eval/reward_mean']:+.3f} (min/median/max {row['eval/reward_min']:+.3f}/"
        f"{row['eval/reward_p50']:+.3f}/{row['eval/reward_max']:+.3f}){spread}{extra} on {row['eval/n_prompts']} prompts x {k} at "
        f"T={row['eval/temperature']:g}{failed} in {row['eval/seconds']:.1f}s (trainer now at version "
        f"{row['eval/trainer_version']})" + (f"; skipped {row['eval/skipped']}" if row["eval/skipped"] else "")
    )
