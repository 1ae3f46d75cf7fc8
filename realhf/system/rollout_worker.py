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
a thread), then reports POST /finish_rollout {qid, accepted, n_tokens}. A refused prompt is
retried first, so no row of the shard is skipped.

Surviving its own death: the worker keeps its in-flight groups under the name-resolve key
`rollout_inflight/<index>` (`{qid: {query_id, pushed}}`, rewritten on admission, push and
finish; not deleted on exit). A restarted worker (same index) finds it before admitting anything:
groups that were pushed are reported finished (accepted), the others are abandoned at the manager
(their slots freed, nothing counted) and run again first, under the same qid.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections import deque
from typing import Dict, Optional

from realhf.api.agent import Prompt, make_agent
from realhf.api.worker_configs import RolloutWorkerConfig
from realhf.api.env import make_env
from realhf.api.trajectory import Trajectory
from realhf.base import name_resolve, names
from realhf.api.prompt import PromptRow
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_jsonl_prompts, shard
from realhf.system.generation_client import GenerationClient
from realhf.system.http_json import GenerationError
from realhf.system.manager_client import ManagerClient
from realhf.system.push_pull_stream import NameResolvingZmqPusher
from realhf.system.worker_base import STATUS_RUNNING, AsyncWorker

# Backoff after a refusal when no own episode ends first: short, and reset on every admission,
# so it bounds the reaction time to capacity freed elsewhere without capping the admission rate.
_MIN_BACKOFF_S, _MAX_BACKOFF_S = 0.005, 0.2


def _resolve(fut: asyncio.Future, error: Optional[BaseException]) -> None:
    if not fut.done():  # the episode may have been cancelled meanwhile
        fut.set_exception(error) if error is not None else fut.set_result(None)


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

    async def push(self, msg) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._queue.put((msg, fut, loop))
        await fut

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
        rows = shard(load_jsonl_prompts(cfg.dataset_path), self.ctx.worker_index, self.ctx.worker_count)
        if not rows:
            raise ValueError(f"rollout worker {self.ctx.worker_index}/{self.ctx.worker_count}: its shard of "
                             f"{cfg.dataset_path} is empty (fewer rows than rollout workers)")
        self.sampler = PromptSampler(rows, seed=cfg.seed + self.ctx.worker_index)
        self._sampler_key = names.rollout_sampler_state(self.ctx.experiment_name, self.ctx.trial_name,
                                                        self.ctx.worker_index)
        # Where to continue the prompt order: a dead incarnation of this worker in this run left
        # its position in name resolve (the launcher clears the trial's keys at start); else a
        # resumed run's checkpoint has it in the config; else the start.
        try:
            state, source = name_resolve.get(self._sampler_key), "this worker's previous incarnation"
        except name_resolve.NameEntryNotFoundError:
            state, source = cfg.sampler_state, "the recovery checkpoint"
        if state:
            self.sampler.load_state_dict(json.loads(state))
            self.logger.info(f"prompt order resumed at epoch {self.sampler.epoch}, position "
                             f"{self.sampler.state_dict()['position']} (from {source})")
        from transformers import AutoTokenizer  # heavy; only this process type needs it

        self.tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path)
        self.agent = make_agent(cfg.agent, gconfig=cfg.gconfig, group_size=cfg.group_size, tokenizer=self.tokenizer)
        self.env = make_env(cfg.env)
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        self.manager_url = name_resolve.wait(names.gserver_manager(exp, trial), timeout=cfg.discovery_timeout)
        self.pusher = NameResolvingZmqPusher(exp, trial, self.ctx.worker_index, self.ctx.worker_count, cfg.n_pullers,
                                             discovery_timeout=cfg.discovery_timeout, send_timeout=cfg.push_timeout)
        self.push_thread = _PushThread(self.pusher)
        self.rows_by_id = {row.query_id: row for row in rows}
        self.inflight_key = names.rollout_inflight(exp, trial, self.ctx.worker_index)
        self.inflight: Dict[str, dict] = {}  # qid -> {query_id, pushed}; mirrored to inflight_key
        self.previous_inflight = self._read_inflight()
        self.rerun: deque = deque()  # (row, qid) of a dead incarnation's groups, run first
        self.client: Optional[GenerationClient] = None
        self.manager: Optional[ManagerClient] = None  # self.client.manager
        self.tasks: Dict[str, asyncio.Task] = {}
        self.pending: Optional[tuple] = None  # a refused (row, qid), tried again first
        self.backoff = _MIN_BACKOFF_S
        self.consecutive_failures = 0
        self.stats = {"pushed": 0, "filtered": 0, "failed": 0, "tokens": 0, "reward_sum": 0.0, "samples": 0,
                      "refused": 0}
        self.t_log, self.groups_at_log, self.tokens_at_log = time.monotonic(), 0, 0
        self.logger.info(f"{len(rows)} prompts in shard {self.ctx.worker_index}/{self.ctx.worker_count}; "
                         f"manager {self.manager_url}; pushing to puller {self.pusher.puller_index}")

    # ---- admission loop ---------------------------------------------------------------------------
    async def _poll_async(self) -> bool:
        if self.client is None:
            self.client = GenerationClient(
                self.manager_url, new_tokens_per_chunk=self.config.new_tokens_per_chunk,
                request_timeout=self.config.request_timeout, manager_timeout=self.config.manager_timeout,
                eos_token_id=self.tokenizer.eos_token_id, server_wait_timeout=self.config.server_wait_timeout)
            self.manager = self.client.manager
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
            await asyncio.wait(list(self.tasks.values()), timeout=self.ctx.status_check_interval,
                               return_when=asyncio.FIRST_COMPLETED)
        elif refused:
            # Capacity frees when one of ours ends, or elsewhere (another worker's finish, a new
            # trainer version): wait for the first of the two, the latter bounded by the backoff.
            if self.tasks:
                await asyncio.wait(list(self.tasks.values()), timeout=self.backoff,
                                   return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(self.backoff)
            self.backoff = min(_MAX_BACKOFF_S, self.backoff * 2)
        self._reap()

    async def _fill(self) -> tuple:
        """Admit and start episodes until this worker is full or the manager refuses;
        returns (how many were admitted, whether the manager refused)."""
        n = 0
        while len(self.tasks) < self.config.max_concurrent_rollouts:
            if self.pending is None and self.rerun:
                self.pending = self.rerun.popleft()
            if self.pending is None:
                row = self.sampler.next()
                self.pending = (row, f"{row.query_id}@{self.sampler.epoch}")
                # Read by the master when it checkpoints (rollout workers take no requests).
                name_resolve.add(self._sampler_key, json.dumps(self.sampler.state_dict()), replace=True)
            row, qid = self.pending
            ok, reason = await self.manager.allocate_rollout(qid, self.pusher.puller_index)
            if not ok:
                self.stats["refused"] += 1
                return n, True
            self.pending = None
            self._set_inflight(qid, {"query_id": row.query_id, "pushed": False})
            self.tasks[qid] = asyncio.create_task(self._episode(row, qid), name=f"episode-{qid}")
            n += 1
        return n, False

    def _experiment_ended(self) -> bool:
        key = names.experiment_status(self.ctx.experiment_name, self.ctx.trial_name)
        try:
            return name_resolve.get(key) != STATUS_RUNNING
        except name_resolve.NameEntryNotFoundError:
            return True

    def _reap(self) -> None:
        for qid, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[qid]
                task.result()  # an episode re-raises only when the worker must stop

    # ---- one episode ------------------------------------------------------------------------------
    async def _episode(self, row: PromptRow, qid: str) -> None:
        accepted, n_tokens = False, 0
        try:
            ids = self.tokenizer(row.prompt, add_special_tokens=False)["input_ids"]
            prompt = Prompt.of(row, qid, ids)
            traj = await self.agent.collect_trajectory(prompt, self.env, self.client)
            if traj is not None:
                if not isinstance(traj, Trajectory):
                    raise TypeError(f"agent {self.config.agent.type!r} returned {type(traj).__name__}, "
                                    "expected a Trajectory or None")
                msg = traj.to_msg()
                await self.push_thread.push(msg)
                self._set_inflight(qid, {"query_id": row.query_id, "pushed": True})
                accepted, n_tokens = True, traj.n_generated_tokens
                self._count(traj)
            else:
                self.stats["filtered"] += 1
            self.consecutive_failures = 0
        except Exception as e:  # noqa: BLE001 - one bad episode must not end the worker
            if self._experiment_ended():
                # At the end of a trial the manager and servers leave first: not a failure.
                self.logger.info(f"episode {qid} left unfinished: the experiment ended ({type(e).__name__})")
                raise
            self.stats["failed"] += 1
            self.consecutive_failures += 1
            self.logger.error(f"episode {qid} failed ({self.consecutive_failures} in a row): {type(e).__name__}: {e}")
            if self.consecutive_failures >= self.config.max_consecutive_failures:
                raise RuntimeError(f"{self.consecutive_failures} episodes failed in a row; last: {e}") from e
        finally:
            self.client.forget(qid)
            await self.manager.finish_rollout(qid, accepted, n_tokens)
            self._set_inflight(qid, None)
        self._maybe_log()

    # ---- in-flight record (survives a SIGKILL of this process) ------------------------------------
    def _read_inflight(self) -> Optional[Dict[str, dict]]:
        """What a previous incarnation of this worker in this trial left in flight; None if this
        is the first incarnation (the launcher clears the trial's keys at start)."""
        try:
            value = json.loads(name_resolve.get(self.inflight_key))
        except name_resolve.NameEntryNotFoundError:
            return None
        except ValueError:
            self.logger.warning(f"ignoring an unreadable in-flight record under {self.inflight_key}")
            return {}
        return value if isinstance(value, dict) else {}

    def _set_inflight(self, qid: str, entry: Optional[dict]) -> None:
        if entry is None:
            self.inflight.pop(qid, None)
        else:
            self.inflight[qid] = entry
        # Not deleted on exit: it is what a restarted incarnation needs after this one died.
        name_resolve.add(self.inflight_key, json.dumps(self.inflight), replace=True, delete_on_exit=False)

    async def _recover_inflight(self, previous: Dict[str, dict]) -> None:
        """A previous incarnation died with these groups in flight: finish the pushed ones,
        free the others' slots and run them again first."""
        pushed = [q for q, e in previous.items() if isinstance(e, dict) and e.get("pushed")]
        lost = [q for q in previous if q not in pushed]
        for qid in pushed:  # the trainer has them: count them as accepted
            try:
                await self.manager.finish_rollout(qid, True, 0)
            except GenerationError:  # 404: the manager already knows it ended
                pass
        r = await self.manager.abandon_rollouts(lost) if lost else {"abandoned": 0}
        for qid in lost:
            entry = previous[qid] if isinstance(previous[qid], dict) else {}
            row = self.rows_by_id.get(str(entry.get("query_id")))
            if row is not None:
                self.rerun.append((row, qid))
        name_resolve.add(self.inflight_key, json.dumps({}), replace=True, delete_on_exit=False)
        self.logger.warning(f"restarted: previous incarnation left {len(previous)} groups in flight: "
                            f"{len(pushed)} already pushed (reported finished), {r.get('abandoned')} slots "
                            f"released at the manager, {len(self.rerun)} prompts re-admitted first")

    def _count(self, traj: Trajectory) -> None:
        s = self.stats
        s["pushed"] += 1
        s["tokens"] += traj.n_generated_tokens
        s["reward_sum"] += sum(x.reward for x in traj.samples)
        s["samples"] += len(traj.samples)

    def _maybe_log(self) -> None:
        s = self.stats
        done = s["pushed"] + s["filtered"]
        if done - self.groups_at_log < self.config.log_every_groups:
            return
        now = time.monotonic()
        dt = max(now - self.t_log, 1e-6)
        self.logger.info(
            f"groups pushed={s['pushed']} filtered={s['filtered']} failed={s['failed']} running={len(self.tasks)} "
            f"| {(done - self.groups_at_log) / dt:.2f} groups/s {(s['tokens'] - self.tokens_at_log) / dt:.0f} tok/s "
            f"| mean reward {s['reward_sum'] / max(s['samples'], 1):.3f} | refusals {s['refused']} "
            f"| epoch {self.sampler.epoch}")
        self.t_log, self.groups_at_log, self.tokens_at_log = now, done, s["tokens"]

    # ---- exit -------------------------------------------------------------------------------------
    async def _exit_hook_async(self) -> None:
        tasks = list(getattr(self, "tasks", {}).values())
        for t in tasks:
            t.cancel()
        if tasks:
            # Cancelled episodes still report /finish_rollout (freeing their slots) if the
            # manager answers quickly; a manager that hangs must not hold the exit.
            await asyncio.wait(tasks, timeout=5.0)
        await self._close_env()
        if getattr(self, "client", None) is not None:
            await self.client.close()

    async def _close_env(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            await env.aclose()

    def _exit_hook(self) -> None:
        if getattr(self, "env", None) is not None:  # the loop never ran (configure failed)
            asyncio.run(self._close_env())
        if getattr(self, "push_thread", None) is not None and not self.push_thread.close(timeout=5.0):
            # A push blocked on a trainer that is gone: its daemon thread must not hold the exit.
            self.logger.warning("a push is still blocked after 5s; exiting without closing the socket")
        elif getattr(self, "pusher", None) is not None:
            self.pusher.close()
