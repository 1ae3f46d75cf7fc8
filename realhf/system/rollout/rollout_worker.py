"""The RolloutWorker: many agent episodes at once, each admitted by the GserverManager.

Its loop, in one asyncio event loop:

    while fewer than `max_concurrent_rollouts` episodes are in flight:
        next prompt of this worker's shard → POST /allocate_rollout {qid, rank}
            (rank: the DP head this worker pushes to; each head has its own admission budget)
        admitted: start the episode as a task;  refused: stop filling
    wait until an episode ends (a slot frees) or a short backoff passes (the trainer's version,
    hence capacity, may have changed elsewhere)

An episode runs the agent (generation through the manager and servers, rewards from the
environment), pushes the finished group to this worker's DP head over ZMQ (a blocking send, so in
a thread), then reports POST /finish_rollout {qid, accepted, n_tokens, reason}. A refused prompt is
retried first, so no row of the shard is skipped. An episode that runs past
`episode_timeout` is cancelled, or whose group the trainer would refuse (a non-finite reward,
no samples: `Trajectory.problem`), fails: its slot is freed unaccepted and it is logged by qid,
agent and environment. The first error from each line of the user's code is also reported to
the launcher's console (`realhf.system.user_errors`); after `max_consecutive_failures` failures
in a row the worker exits — for a restart, or, when they were all one error in user code, with
`DoNotRestart`: a new process would only repeat it (`realhf.system.rollout.episode_failures`).

Surviving its own death, and a resumed run: the worker keeps one record of every prompt it has
drawn and not seen to its end under the name-resolve key `rollout_record/<index>` (kept on exit),
rewritten whole at each draw, admission, push and end (docs/architecture.md §12.3):
`{seq, sampler, refused, todo, inflight: {qid: {query_id, state}}, pushed, consumed}`. The master
reads it after every step to keep the prompts still pending (stored in each recovery checkpoint),
then acknowledges the `seq` it read (`rollout_record_ack/<index>`): `pushed`/`consumed` entries
up to it are forgotten. A
restarted worker (same index) finds the record before admitting anything: groups that were
pushed are reported finished (accepted), the other in-flight ones are abandoned at the manager
(their slots freed, nothing counted) and, unless they had ended (filtered or failed, only the
report was lost), run again first, under the same qid, after the refused and to-do prompts. A
worker of a resumed run with no record starts from the checkpoint: its sampler position and its
share of the checkpoint's pending prompts (`pending`), run first. An exit by an exception is no different
from a SIGKILL: episodes cancelled at exit release their slots but stay in the record, except
one whose push was already under way and completes (waited for up to 3 s): it is finished
accepted, so that it is not pushed twice.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections import deque
from typing import Dict, Optional

from realhf.api.agent import RewardTimeout, make_agent
from realhf.api.env import EnvFactory
from realhf.api.prompt import PromptRow
from realhf.api.trajectory import Trajectory
from realhf.api.worker_configs import RolloutWorkerConfig
from realhf.base import name_resolve, names
from realhf.base.user_code import ErrorReport
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_prompts, shard
from realhf.impl.dataset.prompt_encoding import chat_template_on
from realhf.impl.dataset.tokenizer_loading import load_tokenizer
from realhf.system import user_errors
from realhf.system.manager.manager_client import ManagerClient
from realhf.system.rollout.episode import AgentError, episode_prompt, run_group
from realhf.system.rollout.episode_failures import FailureStreak, ReportedSites
from realhf.system.rollout.generation_client import GenerationClient
from realhf.system.rollout.openai_server import OpenAIServer, episode_endpoint
from realhf.system.streams.http_json import GenerationError, ServerUnavailableError
from realhf.system.streams.push_pull_stream import MessageTooLarge, NameResolvingZmqPusher
from realhf.system.worker_base import STATUS_RUNNING, AsyncWorker, DoNotRestart, experiment_status

# Backoff after a refusal when no own episode ends first: short, and reset on every admission,
# so it bounds the reaction time to capacity freed elsewhere without capping the admission rate.
_MIN_BACKOFF_S, _MAX_BACKOFF_S = 0.005, 0.2
# Tries of /finish_rollout (or /abandon_rollouts) before the worker gives up (backoff 0.5, 1, 2, 4 s).
_SETTLE_ATTEMPTS = 5


def _resolve(fut: asyncio.Future, error: Optional[BaseException]) -> None:
    if not fut.done():  # the episode may have been cancelled meanwhile
        fut.set_exception(error) if error is not None else fut.set_result(None)


class EpisodeTimeout(Exception):
    """An episode ran longer than rollout.episode_timeout."""


class MalformedGroup(Exception):
    """An agent's group the trainer would refuse (Trajectory.problem)."""


class BadPrompt(Exception):
    """A prompt no server can answer: empty, or leaving no room for max_new_tokens in the context."""


class _PushThread:
    """Pushes trajectories from one daemon thread: ZMQ sockets are not thread-safe, a push may
    block (back-pressure from a full trainer queue), and the event loop must not."""

    def __init__(self, pusher):
        self._pusher = pusher
        self._queue: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="push", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            msg, fut, loop = item
            error = None
            try:
                self._pusher.push(msg)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting episode
                error = e
            try:
                loop.call_soon_threadsafe(_resolve, fut, error)
            except RuntimeError:  # the event loop is gone: the worker is exiting
                pass

    def start(self, msg) -> asyncio.Future:
        """Queue `msg`; the future resolves when the send is done (or failed). Await it shielded:
        a cancelled episode must still learn whether its group went out."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((msg, fut, loop))
        return fut

    def close(self, timeout: float) -> bool:
        """Stop after the queued pushes; False if still busy after `timeout` s."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


class RolloutWorker(AsyncWorker):
    config_cls = RolloutWorkerConfig

    def _configure(self) -> None:
        cfg: RolloutWorkerConfig = self.config
        if not cfg.dataset_path or not cfg.tokenizer_path:
            raise ValueError("rollout.dataset_path and rollout.tokenizer_path must be set")
        self.tokenizer = load_tokenizer(cfg.tokenizer_path)  # without torch (tokenizer_loading says how)
        self.chat = chat_template_on(cfg.chat_template, self.tokenizer)
        self.agent = make_agent(cfg.agent, tokenizer=self.tokenizer)
        self.envs = EnvFactory(cfg.env)
        rows = shard(
            load_prompts(
                cfg.dataset_path,
                required=self.envs.required_fields,
                columns=cfg.dataset_columns,
                split=cfg.dataset_split,
                config_name=cfg.dataset_config_name,
            ),
            self.ctx.worker_index,
            self.ctx.worker_count,
        )
        if not rows:
            raise ValueError(
                f"rollout worker {self.ctx.worker_index}/{self.ctx.worker_count}: its shard of "
                f"{cfg.dataset_path} is empty (fewer rows than rollout workers)"
            )
        self.sampler = PromptSampler(rows, seed=cfg.seed + self.ctx.worker_index)
        self.rows_by_id = {row.query_id: row for row in rows}
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        self.record_key = names.rollout_record(exp, trial, self.ctx.worker_index)
        self.ack_key = names.rollout_record_ack(exp, trial, self.ctx.worker_index)
        self.seq = 0  # of the last record written; the master acknowledges the seq it read
        self.inflight: Dict[str, dict] = {}  # qid -> {query_id, state: running|pushed|ended}
        self.pushed: Dict[str, dict] = {}  # qid -> {query_id, seq}: pushed, not yet read by the master
        self.consumed: Dict[str, dict] = {}  # the same for filtered and failed groups (never trained)
        self.rerun: deque = deque()  # (row, qid) to run first: a dead incarnation's or the checkpoint's
        self.pending: Optional[tuple] = None  # a drawn (row, qid) not yet admitted (refused: tried again first)
        self.refused_at_death: Optional[str] = None  # a dead incarnation's unadmitted qid (its slot is freed)
        # Where to continue: a dead incarnation of this worker in this run left its record (the
        # launcher clears the trial's keys at start); else a resumed run's checkpoint is in the
        # config; else the start.
        self.previous_inflight = self._load_record()
        if self.previous_inflight is None:
            self._load_checkpoint_state(cfg)
        self.manager_key = names.gserver_manager(exp, trial)
        self.manager_url = name_resolve.wait(self.manager_key, timeout=cfg.discovery_timeout)
        self.pusher = NameResolvingZmqPusher(
            exp,
            trial,
            self.ctx.worker_index,
            self.ctx.worker_count,
            cfg.n_pullers,
            discovery_timeout=cfg.discovery_timeout,
            send_timeout=cfg.push_timeout,
            secret=self.ctx.secret,
            max_message_bytes=cfg.max_message_bytes,
        )
        self.push_thread = _PushThread(self.pusher)
        self.client: Optional[GenerationClient] = None
        self.manager: Optional[ManagerClient] = None  # self.client.manager
        self.tasks: Dict[str, asyncio.Task] = {}
        self.backoff = _MIN_BACKOFF_S
        self.streak = FailureStreak(cfg.max_consecutive_failures)  # failed episodes in a row
        self.reported = ReportedSites()  # places in user code already told to the launcher
        self.gave_up = False  # the run's end was asked for (a fatal record published)
        self.bad_prompts: set = set()  # query ids no server can answer (dropped once)
        self.stats = {
            "pushed": 0,
            "filtered": 0,
            "failed": 0,
            "timed_out": 0,
            "too_large": 0,
            "bad_prompts": 0,
            "tokens": 0,
            "reward_sum": 0.0,
            "samples": 0,
            "refused": 0,
            "gen_calls": 0,
        }
        self.t_log, self.groups_at_log, self.tokens_at_log = time.monotonic(), 0, 0
        self.logger.info(
            f"{len(rows)} prompts in shard {self.ctx.worker_index}/{self.ctx.worker_count}; "
            f"manager {self.manager_url}; pushing to puller {self.pusher.puller_index}"
        )

    # ---- admission loop ---------------------------------------------------------------------------
    async def _poll_async(self) -> bool:
        if self.client is None:
            self.client = GenerationClient(
                self.manager_url,
                new_tokens_per_chunk=self.config.new_tokens_per_chunk,
                request_timeout=self.config.request_timeout,
                manager_timeout=self.config.manager_timeout,
                eos_token_id=self.tokenizer.eos_token_id,
                server_wait_timeout=self.config.server_wait_timeout,
                secret=self.ctx.secret,
                manager_wait_timeout=self.config.manager_wait_timeout,
                manager_resolve=lambda: name_resolve.get(self.manager_key),
                stopped=self._experiment_ended,
            )
            self.manager = self.client.manager
            # What the environment's episodes share (a grader pool, an MCP server) opens now, in
            # this loop: if it cannot, the worker fails at once, not episode after episode.
            await self.envs.tools()
            if self.previous_inflight is not None:  # a restart: settle what the dead incarnation left
                await self._recover_inflight(self.previous_inflight)
                self.previous_inflight = None
        try:
            await self._step()
        except Exception as e:
            if self._experiment_ended():  # the manager may leave first at the end of a trial
                self.request_stop(f"experiment ended ({type(e).__name__} while it did: {e})")
                return False
            raise
        return True

    async def _step(self) -> None:
        admitted, refused = await self._fill()
        if admitted:
            self.backoff = _MIN_BACKOFF_S
        if len(self.tasks) >= self.config.max_concurrent_rollouts:
            # Bounded so the loop still notices the end of the experiment while episodes hang.
            await asyncio.wait(
                list(self.tasks.values()), timeout=self.ctx.status_check_interval, return_when=asyncio.FIRST_COMPLETED
            )
        elif refused:
            # Capacity frees when one of ours ends, or elsewhere (another worker's finish, a new
            # trainer version): wait for the first of the two, the latter bounded by the backoff.
            if self.tasks:
                await asyncio.wait(list(self.tasks.values()), timeout=self.backoff, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(self.backoff)
            self.backoff = min(_MAX_BACKOFF_S, self.backoff * 2)
        self._reap()

    async def _fill(self) -> tuple:
        """Admit and start episodes until this worker is full or the manager refuses;
        returns (how many were admitted, whether the manager refused)."""
        n = 0
        self._apply_ack()
        while len(self.tasks) < self.config.max_concurrent_rollouts:
            if self.pending is None and self.rerun:
                self.pending = self.rerun.popleft()  # still in the record (todo -> refused): no write
            if self.pending is None:
                row = self.sampler.next()
                if row.query_id in self.bad_prompts:
                    continue  # dropped once already (_check_prompt)
                self.pending = (row, f"{row.query_id}@{self.sampler.epoch}")
                self._write_record()  # the new position and the drawn prompt, together
            row, qid = self.pending
            ok, reason = await self.manager.allocate_rollout(qid, self.pusher.puller_index)
            if not ok:
                self.stats["refused"] += 1
                return n, True
            self.pending = None
            self._set_inflight(qid, row.query_id, "running")
            self.tasks[qid] = asyncio.create_task(self._episode(row, qid), name=f"episode-{qid}")
            n += 1
        return n, False

    def _experiment_ended(self) -> bool:
        # A missing status key or a dead Redis raises NameResolveLost: a failure, not an end.
        return experiment_status(self.ctx) != STATUS_RUNNING

    def _reap(self) -> None:
        for qid, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[qid]
                task.result()  # an episode re-raises only when the worker must stop

    # ---- one episode ------------------------------------------------------------------------------
    def _names(self, qid: str) -> str:
        return f"episode {qid} (agent {self.config.agent.type}, env {self.config.env.type})"

    async def _collect(self, row: PromptRow, qid: str) -> Optional[Trajectory]:
        """The agent's episodes of one group, cancelled after `episode_timeout` s (0: no limit).
        Cancelling runs the agent's own clean-up (finally/async with) and closes every
        environment of the group."""
        cfg, fields = self.config, row.as_dict()
        prompt = await episode_prompt(self.agent, self.envs, self.tokenizer, fields, self.chat)
        self._check_prompt(row, prompt)
        coro = run_group(
            self.agent,
            fields,
            prompt,
            qid=qid,
            client=self.client,
            envs=self.envs,
            gconfig=cfg.gconfig,
            tokenizer=self.tokenizer,
            agent_config=cfg.agent,
            group_size=cfg.group_size,
            openai_endpoint=episode_endpoint,
            one_request=cfg.group_in_one_request,
        )
        limit = self.config.episode_timeout
        if limit <= 0:
            return await coro
        try:
            return await asyncio.wait_for(coro, limit)
        except asyncio.TimeoutError:
            self.stats["timed_out"] += 1
            raise EpisodeTimeout(
                f"{self._names(qid)} ran longer than rollout.episode_timeout={limit:g}s "
                f"and was cancelled ({self.stats['timed_out']} timed out so far)"
            ) from None

    def _check_prompt(self, row: PromptRow, prompt) -> None:
        """Validation tokenises only the first part of a large dataset (file_validation.SCAN_MAX_ROWS):
        a prompt beyond it that no server can answer is dropped here, once — its query id is not
        drawn again in later epochs — and counted (`bad_prompt`), instead of failing every epoch."""
        limit = self.config.context_tokens - self.config.gconfig.max_new_tokens
        if self.config.context_tokens > 0 and (not prompt or len(prompt) > limit):
            self.bad_prompts.add(row.query_id)
            raise BadPrompt(
                f"prompt {row.query_id!r} ({row.source}) has {len(prompt)} tokens; with "
                f"max_new_tokens={self.config.gconfig.max_new_tokens} the servers' context of "
                f"{self.config.context_tokens} leaves {'no room' if prompt else 'nothing to answer'}: "
                f"dropped, not drawn again ({len(self.bad_prompts)} such prompts so far)"
            )

    def _failed(self, qid: str, e: Exception) -> None:
        """Count and log a failed episode; report the user's errors to the launcher (once per
        place); give up after max_consecutive_failures in a row (realhf.system.rollout.episode_failures)."""
        self.stats["failed"] += 1
        self.stats["too_large"] += isinstance(e, MessageTooLarge)
        report = ErrorReport.of(e)
        self.streak.failed(report)
        named = isinstance(e, (EpisodeTimeout, MalformedGroup))  # their message names the episode
        what = str(e) if named else f"{self._names(qid)}: {report.one_line()}"
        self.logger.error(f"failed ({self.streak.n} in a row): {what}")
        # The agent's own error, or its misuse of the episode API that realhf names (AgentError).
        users = report.by_user or isinstance(e, AgentError)
        if users and self.reported.first_time(report):
            self.logger.error(f"(reported to the launcher; its traceback:)\n{report.traceback}")
            user_errors.publish(self.ctx, report, self._names(qid))
        if not self.streak.exhausted:
            return
        same = self.streak.one_error()
        if users and same is not None:
            reason = (
                f"failed {self.streak.n} episodes in a row with one error in user code, which a restart "
                f"would only repeat: {same.one_line()}"
            )
            if not self.gave_up:  # episodes still ending until the exit would say it again
                self.gave_up = True
                user_errors.publish(self.ctx, same, self._names(qid), fatal=True, reason=reason)
            raise DoNotRestart(reason) from e
        raise RuntimeError(f"{self.streak.n} episodes failed in a row; last: {report.one_line()}") from e

    async def _episode(self, row: PromptRow, qid: str) -> None:
        accepted, n_tokens, cancelled, push, traj, reason = False, 0, False, None, None, "filtered"
        try:
            traj = await self._collect(row, qid)
            if traj is not None:
                problem = traj.problem()
                if problem is not None:  # the trainer would refuse it: fail here, slot freed
                    raise MalformedGroup(f"{self._names(qid)}: malformed group, not pushed: {problem}")
                push = self.push_thread.start(traj.to_msg())
                await asyncio.shield(push)
                accepted, n_tokens = self._pushed(row, qid, traj)
            else:
                self.stats["filtered"] += 1
            self.streak.succeeded()
        except Exception as e:  # noqa: BLE001 - one bad episode must not end the worker
            if self._experiment_ended():
                # At the end of a trial the manager and servers leave first: not a failure.
                self.logger.info(f"episode {qid} left unfinished: the experiment ended ({type(e).__name__})")
                raise
            if isinstance(e, BadPrompt):  # the data's fault, not the episode's: no failure streak
                reason = "bad_prompt"
                self.stats["bad_prompts"] += 1
                self.logger.warning(str(e))
            else:
                reason = (
                    "too_large"
                    if isinstance(e, MessageTooLarge)
                    else "timed_out"
                    if isinstance(e, EpisodeTimeout)
                    else "reward_timed_out"
                    if isinstance(e, RewardTimeout)
                    else "malformed"
                    if isinstance(e, MalformedGroup)
                    else "failed"
                )
                self._failed(qid, e)  # raises after max_consecutive_failures in a row
        except BaseException:  # cancelled at exit, or an error that ends the worker: run it again
            if not accepted and push is not None and await self._went_out(push):
                accepted, n_tokens = self._pushed(row, qid, traj)  # not to be run twice
            cancelled = True
            raise
        finally:
            self.client.forget(qid)
            await self._settle(row, qid, accepted, n_tokens, cancelled and not accepted, reason)
        self._maybe_log()

    def _pushed(self, row: PromptRow, qid: str, traj: Trajectory) -> tuple:
        self.pushed[qid] = {"query_id": row.query_id, "seq": self.seq + 1}
        self._set_inflight(qid, row.query_id, "pushed")
        self._count(traj)
        return True, traj.n_generated_tokens

    @staticmethod
    async def _went_out(push: asyncio.Future, timeout: float = 3.0) -> bool:
        """Whether a push in progress when its episode was cancelled completed after all."""
        await asyncio.wait({push}, timeout=timeout)
        return push.done() and not push.cancelled() and push.exception() is None

    async def _settle(
        self, row: PromptRow, qid: str, accepted: bool, n_tokens: int, rerun: bool, reason: str = "filtered"
    ) -> None:
        """Report the episode's end to the manager and drop it from the in-flight record. A
        cancelled, unpushed episode (`rerun`) is abandoned instead and stays in the record, so the
        next incarnation runs it again. If the report fails, the record keeps the group (marked
        ended) for the next incarnation to settle, and the error ends this worker."""
        if not rerun and not accepted:
            self.consumed[qid] = {"query_id": row.query_id, "seq": self.seq + 1}
            self._set_inflight(qid, row.query_id, "ended")
        for attempt in range(_SETTLE_ATTEMPTS):
            try:
                if rerun:
                    await self.manager.abandon_rollouts([qid])
                else:
                    await self.manager.finish_rollout(qid, accepted, n_tokens, reason)
                break
            except (ServerUnavailableError, TimeoutError) as e:  # unreachable or overloaded: retry
                if self._experiment_ended():
                    return  # the manager left first at the end of the trial
                if attempt + 1 == _SETTLE_ATTEMPTS:
                    self.logger.error(
                        f"could not report {self._names(qid)} to the manager ({e}); it stays "
                        "in the in-flight record for the next incarnation"
                    )
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
            except GenerationError as e:  # 404: the manager no longer holds it (e.g. it restarted)
                self.logger.warning(f"reporting the end of {qid} refused, its slot is already gone: {e}")
                break
        if not rerun:
            self._set_inflight(qid, row.query_id, None)

    # ---- the record (survives a SIGKILL of this process; read by the master) -----------------------
    def _write_record(self) -> None:
        self.seq += 1
        todo = [[row.query_id, qid] for row, qid in self.rerun]
        refused = [self.pending[0].query_id, self.pending[1]] if self.pending is not None else None
        value = {
            "seq": self.seq,
            "sampler": self.sampler.state_dict(),
            "refused": refused,
            "todo": todo,
            "inflight": self.inflight,
            "pushed": self.pushed,
            "consumed": self.consumed,
        }
        # One add: a reader never sees a drawn prompt in neither or both of two keys. Not deleted on
        # exit: it is what a restarted incarnation needs after this one died.
        name_resolve.add(self.record_key, json.dumps(value), replace=True, delete_on_exit=False)

    def _set_inflight(self, qid: str, query_id: str, state: Optional[str]) -> None:
        if state is None:
            self.inflight.pop(qid, None)
        else:
            self.inflight[qid] = {"query_id": query_id, "state": state}
        self._write_record()

    def _apply_ack(self) -> None:
        """Forget pushed/consumed entries the master has read (it holds them as pending until
        trained or dropped); one name-resolve get per fill."""
        if not self.pushed and not self.consumed:
            return
        try:
            acked = int(name_resolve.get(self.ack_key))
        except name_resolve.NameEntryNotFoundError:
            return
        for entries in (self.pushed, self.consumed):
            for qid in [q for q, e in entries.items() if e["seq"] <= acked]:
                del entries[qid]

    def _queue_rerun(self, pairs) -> int:
        n = 0
        for query_id, qid in pairs:
            row = self.rows_by_id.get(str(query_id))
            if row is None:
                continue  # another worker's shard (a checkpoint's list holds every worker's)
            self.rerun.append((row, qid))
            n += 1
        return n

    def _load_record(self) -> Optional[Dict[str, dict]]:
        """A previous incarnation's record in this trial: its sampler position, pushed/consumed
        entries and prompts to run first are taken over; returns its in-flight groups to settle
        (None if there is no record: the first incarnation)."""
        try:
            rec = json.loads(name_resolve.get(self.record_key))
        except name_resolve.NameEntryNotFoundError:
            return None
        except ValueError:
            self.logger.warning(f"ignoring an unreadable record under {self.record_key}")
            return None
        self.seq = int(rec.get("seq", 0))
        self.sampler.load_state_dict(rec["sampler"])
        self.pushed, self.consumed = dict(rec.get("pushed") or {}), dict(rec.get("consumed") or {})
        firsts = ([rec["refused"]] if rec.get("refused") else []) + list(rec.get("todo") or [])
        self._queue_rerun(firsts)
        self.refused_at_death = rec["refused"][1] if rec.get("refused") else None
        self.logger.info(
            f"prompt order resumed at epoch {self.sampler.epoch}, position "
            f"{self.sampler.state_dict()['position']} (from this worker's previous incarnation); "
            f"{len(self.rerun)} drawn prompts not yet admitted run first"
        )
        return dict(rec.get("inflight") or {})

    def _load_checkpoint_state(self, cfg: RolloutWorkerConfig) -> None:
        if cfg.sampler_state:
            self.sampler.load_state_dict(json.loads(cfg.sampler_state))
            self.logger.info(
                f"prompt order resumed at epoch {self.sampler.epoch}, position "
                f"{self.sampler.state_dict()['position']} (from the recovery checkpoint)"
            )
        if cfg.pending:
            n = self._queue_rerun(json.loads(cfg.pending))
            self.logger.info(
                f"{n} prompts pending at the recovery checkpoint (in flight or not yet trained) "
                "run first, under their qids"
            )
        self._write_record()

    async def _recover_inflight(self, previous: Dict[str, dict]) -> None:
        """A previous incarnation died with these groups in flight: finish the pushed ones,
        free the others' slots and run them again first (after the drawn, unadmitted ones)."""
        state = {q: (e.get("state") if isinstance(e, dict) else None) for q, e in previous.items()}
        pushed = [q for q, st in state.items() if st == "pushed"]
        lost = [q for q in previous if q not in pushed]
        for qid in pushed:  # the trainer has them: count them as accepted
            try:
                await self.manager.finish_rollout(qid, True, 0)
            except GenerationError:  # 404: the manager already knows it ended
                pass
        r = await self.manager.abandon_rollouts(lost) if lost else {"abandoned": 0}
        # The refused prompt too: a retry may have been admitted just before the death, unrecorded
        # (it runs first again either way: _load_record queued it). Apart, so that the line below
        # adds up: pushed + released = left.
        late = (
            (await self.manager.abandon_rollouts([self.refused_at_death])).get("abandoned")
            if self.refused_at_death
            else 0
        )
        readmitted = self._queue_rerun(
            [[previous[q].get("query_id"), q] for q in lost if state[q] != "ended" and isinstance(previous[q], dict)]
        )
        self.inflight = {}
        self._write_record()
        self.logger.warning(
            f"restarted: previous incarnation left {len(previous)} groups in flight: "
            f"{len(pushed)} already pushed (reported finished), {r.get('abandoned')} slots "
            f"released at the manager, {readmitted} prompts re-admitted first"
            + ("; the prompt refused as it died had been admitted after all: its slot released too" if late else "")
        )

    def _count(self, traj: Trajectory) -> None:
        s = self.stats
        s["pushed"] += 1
        s["tokens"] += traj.n_generated_tokens
        s["reward_sum"] += sum(x.reward for x in traj.samples)
        s["samples"] += len(traj.samples)
        s["gen_calls"] += sum(traj.metadata.get("gen_calls", [1] * len(traj.samples)))

    def _maybe_log(self) -> None:
        s = self.stats
        done = s["pushed"] + s["filtered"]
        if done - self.groups_at_log < self.config.log_every_groups:
            return
        now = time.monotonic()
        dt = max(now - self.t_log, 1e-6)
        self.logger.info(
            f"{self._totals()} | {(done - self.groups_at_log) / dt:.2f} groups/s "
            f"{(s['tokens'] - self.tokens_at_log) / dt:.0f} tok/s | epoch {self.sampler.epoch}"
        )
        self.t_log, self.groups_at_log, self.tokens_at_log = now, done, s["tokens"]

    def _totals(self) -> str:
        s = self.stats
        return (
            f"groups pushed={s['pushed']} filtered={s['filtered']} failed={s['failed']} (timed out "
            f"{s['timed_out']}, too large to send {s['too_large']}) running={len(self.tasks)} | mean reward {s['reward_sum'] / max(s['samples'], 1):.3f} "
            f"| generations/episode {s['gen_calls'] / max(s['samples'], 1):.2f} | refusals {s['refused']}"
        )

    # ---- exit -------------------------------------------------------------------------------------
    async def _exit_hook_async(self) -> None:
        if getattr(self, "stats", None) is not None:
            self.logger.info(f"at exit: {self._totals()}")
        tasks = list(getattr(self, "tasks", {}).values())
        for t in tasks:
            t.cancel()
        if tasks:
            # Cancelled episodes still free their slots (/abandon_rollouts; they stay in the
            # in-flight record to run again) if the manager answers quickly; a manager that
            # hangs must not hold the exit.
            await asyncio.wait(tasks, timeout=5.0)
        await self._close_envs()
        await OpenAIServer.close_for_this_loop()
        if getattr(self, "client", None) is not None:
            await self.client.close()

    async def _close_envs(self) -> None:
        envs, self.envs = getattr(self, "envs", None), None
        if envs is not None:
            await envs.aclose()

    def _exit_hook(self) -> None:
        if getattr(self, "envs", None) is not None:  # the loop never ran (configure failed)
            asyncio.run(self._close_envs())
        if getattr(self, "push_thread", None) is not None and not self.push_thread.close(timeout=5.0):
            # A push blocked on a trainer that is gone: its daemon thread must not hold the exit.
            self.logger.warning("a push is still blocked after 5s; exiting without closing the socket")
        elif getattr(self, "pusher", None) is not None:
            self.pusher.close()
