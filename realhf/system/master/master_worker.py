"""MasterWorker: drives the training steps over request/reply (docs/architecture.md §2, §7).

configure: bind the request socket → wait for the model workers → initialize them
each step: wait until every DP head holds its share of B groups (poll `fetch`; now and then
           `catch_up`: the trainer's current weights to a server that joined meanwhile) → take them →
           split them anew across the ranks by tokens (`balance`, realhf.system.master.dp_balance) →
           the nodes of the step's graph (realhf.system.trainer.ppo_step), wave by wave, each
           one request to every model worker → publish training_samples → log the step's metrics
the end:   after total_train_steps (set by the experiment), or after the first step at which
           the training time reaches exp_ctrl.max_train_seconds, save, set
           experiment_status=COMPLETE (every worker then leaves its loop), exit
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from realhf.api.worker_configs import MasterWorkerConfig
from realhf.base import name_resolve, names
from realhf.base.trainer_layout import TrainerLayout
from realhf.base.trial_files import completions_path, metrics_path, read_metrics
from realhf.system.manager.admission_ledger import ENDED_REASONS, AdmissionLedger, accounting, accounting_line
from realhf.system.manager.staleness import dp_shares, resumed_accepted
from realhf.system.master import dp_balance, stall_report
from realhf.system.stats.completion_log import console_lines
from realhf.system.stats.stats_logger import (
    TRAINED_QIDS_FILE,
    CompletionsLog,
    StatsLogger,
    TrainedQidsLog,
    step_metrics,
    truncate_metrics,
)
from realhf.system.streams.request_reply_stream import MasterStream
from realhf.system.trainer import ppo_step
from realhf.system.worker_base import STATUS_COMPLETE, Worker, WorkerExit

# At the end, how long the accounting waits for groups still on their way to the DP heads.
ACCOUNT_SETTLE_S = 1.0


class MasterWorker(Worker):
    config_cls = MasterWorkerConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._dropped: set = set()  # qids the DP heads dropped (stale) in this incarnation: never trained

    # ---- set-up -----------------------------------------------------------------------------
    def _configure(self) -> None:
        cfg: MasterWorkerConfig = self.config
        self._stream: Optional[MasterStream] = None
        self._stats: Optional[StatsLogger] = None
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        self.total_steps = cfg.total_train_steps
        self.graph = ppo_step.build_graph(cfg.ppo)
        self.shares = dp_shares(cfg.groups_per_step, len(self._heads))

        self._stream = MasterStream(
            exp,
            trial,
            cfg.n_model_workers,
            host=cfg.bind_host,
            secret=self.ctx.secret,
            max_message_bytes=cfg.max_message_bytes,
            n_node_workers=cfg.n_node_workers,
        )
        self._stream.check_stop = self._exit_if_asked
        node = f" and {cfg.n_node_workers} node worker" if cfg.n_node_workers else ""
        self.logger.info(f"waiting for {cfg.n_model_workers} model workers{node} at {self._stream.address}")
        self._stream.wait_for_workers(cfg.worker_connect_timeout)
        replies = self._stream.call_all("initialize", timeout=cfg.request_timeout)
        versions = sorted({r["version"] for r in replies})
        if len(versions) != 1:
            raise RuntimeError(f"model workers disagree on the starting version: {versions}")
        self.version = versions[0]
        # The prompt accounting a resumed run continues (docs/architecture.md §12.3).
        resumed = replies[0].get("resume") or {}
        self._pending: Dict[str, str] = {qid: str(query_id) for query_id, qid in resumed.get("rollout_pending", [])}
        self._samplers: Dict[str, Any] = dict(resumed.get("rollout_samplers") or {})

        self.metrics_path = metrics_path(cfg.log_dir)
        # Steps after the checkpoint we resume from will be run again: their old lines go.
        kept = truncate_metrics(self.metrics_path, last_step=self.version)
        # Which prompt groups each step trained ({step, qids} per line): the record that shows a
        # killed-and-resumed run neither repeats nor skips a prompt; resumed steps lose theirs too.
        self._qids_log = TrainedQidsLog(os.path.join(cfg.log_dir, TRAINED_QIDS_FILE), last_step=self.version)
        self._trained = self._read_trained(os.path.join(cfg.log_dir, TRAINED_QIDS_FILE))
        self._completions: Optional[CompletionsLog] = None
        if cfg.stats.log_completions > 0:
            self._completions = CompletionsLog(completions_path(cfg.log_dir), last_step=self.version)
        if self.version > 0:
            self.logger.info(
                f"resuming after step {self.version} (recovery checkpoint); metrics.jsonl keeps {kept} steps"
            )
        self._stats = StatsLogger(
            self.metrics_path,
            cfg.stats.tensorboard_path,
            wandb_project=cfg.stats.wandb_project,
            wandb_run_name=f"{self.ctx.experiment_name}/{self.ctx.trial_name}",
            wandb_mode=cfg.stats.wandb_mode,
            wandb_config=cfg.run_config,
            prometheus_port=cfg.stats.prometheus_port,
            prometheus_host=cfg.bind_host,
        )
        if self._stats.prometheus_url:
            self.logger.info(f"training metrics for Prometheus at {self._stats.prometheus_url}")
        # A version is a completed step (docs/architecture.md §4): a recovered trainer resumes the step count.
        self.step = self.version
        self.training_samples = self.version * cfg.groups_per_step
        # The manager's record of every admission; with the DP heads' counts, where every group is.
        self._ledger = AdmissionLedger(
            names.admission_ledger(self.ctx.experiment_name, self.ctx.trial_name), len(self.shares)
        )
        self._accepted_at_start = resumed_accepted(self.shares, self.training_samples)
        self.stale_dropped = 0  # the total over DP ranks, for metrics and the checkpoint
        self.rejected = 0  # malformed groups the DP heads refused, total over ranks
        self._stale_dropped_per_rank: Optional[List[int]] = None  # what was last published
        self._publish("training_samples", self.training_samples)
        self._update_stale_dropped([])
        self._t_start = self._t_last_step = time.monotonic()
        # Training time is Σ step_time_s of metrics.jsonl; a resumed run continues the budget.
        self._train_s_before = sum(m["step_time_s"] for m in read_metrics(cfg.log_dir))
        self._t_last_ckpt = self._t_last_save = time.monotonic()
        self._ckpt_version = self.version  # resumed from it, or nothing to keep yet
        self.logger.info(
            f"training {self.total_steps} steps of B={cfg.groups_per_step} groups (shares {self.shares}) "
            f"from version {self.version}; step {self.graph.describe()}; policy loss "
            f"{cfg.ppo.policy_loss}, advantages {cfg.ppo.adv_estimator}; metrics in {self.metrics_path}"
        )

    @property
    def _layout(self) -> TrainerLayout:
        cfg = self.config
        return TrainerLayout.of(cfg.n_model_workers, cfg.trainer_tp, cfg.trainer_pp)

    @property
    def _heads(self) -> List[int]:
        """The model workers that are DP heads: with trainer tensor or pipeline parallelism one rank
        of each replica holds its data (fetch); the others follow it (balance and the model calls
        go to all). realhf.base.trainer_layout."""
        return self._layout.heads()

    @staticmethod
    def _read_trained(path: str) -> set:
        """Every qid trained in this trial so far (the file is already cut to the resumed step)."""
        trained: set = set()
        with open(path) as f:
            for line in f:
                if line.strip():
                    trained.update(json.loads(line)["qids"])
        return trained

    def _publish(self, what: str, value: int) -> None:
        key = getattr(names, what)(self.ctx.experiment_name, self.ctx.trial_name)
        name_resolve.add(key, str(int(value)), replace=True, delete_on_exit=False)

    def _update_stale_dropped(self, replies: List[dict]) -> None:
        """Publish each DP rank's total of accepted groups it will never train — stale drops
        plus malformed groups it refused (`rejected`) — from `fetch` replies as a JSON list, as
        soon as one changes: the manager frees admission capacity of that rank's budget
        (docs/architecture.md §4)."""
        per_rank = [0] * len(self.shares)
        stale = rejected = 0
        for r in replies:
            self._dropped.update(r.get("dropped_qids", ()))  # never trained: not pending at a checkpoint
            per_rank[r["dp_rank"]] = int(r["stale_dropped"]) + int(r.get("rejected", 0))
            stale, rejected = stale + int(r["stale_dropped"]), rejected + int(r.get("rejected", 0))
        if per_rank != self._stale_dropped_per_rank:
            if replies and rejected != self.rejected:
                self.logger.warning(
                    f"DP heads refused {rejected - self.rejected} malformed groups ({rejected} in "
                    f"total); their admission slots are handed back as dropped"
                )
            self._stale_dropped_per_rank = per_rank
            self.stale_dropped, self.rejected = stale, rejected
            key = names.stale_dropped(self.ctx.experiment_name, self.ctx.trial_name)
            name_resolve.add(key, json.dumps(per_rank), replace=True, delete_on_exit=False)

    # ---- the loop ---------------------------------------------------------------------------
    def _poll(self) -> bool:
        self._stop_if_asked()
        if self.step >= self.total_steps:
            self._finish(f"all {self.total_steps} train steps done")
        if self._out_of_time():
            self._finish(
                f"training time {self._train_seconds():.1f}s reached exp_ctrl.max_train_seconds="
                f"{self.config.exp_ctrl.max_train_seconds:g} (step {self.step} of {self.total_steps})"
            )
        self._run_step()
        return True

    def _train_seconds(self) -> float:
        """Training seconds at the end of the last step, as Σ step_time_s in metrics.jsonl counts them."""
        return self._train_s_before + (self._t_last_step - self._t_start)

    def _out_of_time(self) -> bool:
        budget = self.config.exp_ctrl.max_train_seconds
        return budget > 0 and self.step > 0 and self._train_seconds() >= budget

    def _wait_for_data(self) -> float:
        """Poll `fetch` until every DP head holds its share; returns the seconds waited."""
        cfg = self.config
        t0 = last_log = caught_up_at = time.monotonic()
        reported_at = 0.0
        while True:
            replies = self._stream.call_all("fetch", {"take": 0}, workers=self._heads, timeout=cfg.request_timeout)
            self._update_stale_dropped(replies)
            short = [r for r in replies if r["buffered"] < self.shares[r["dp_rank"]]]
            if not short:
                return time.monotonic() - t0
            now = time.monotonic()
            waited = now - t0
            if waited > cfg.data_timeout:
                detail = "; ".join(stall_report.data_lines(short, self.shares))
                raise TimeoutError(
                    f"step {self.step + 1}: no full batch within {cfg.data_timeout:.0f}s at version "
                    f"{self.version}: {detail}"
                )
            if cfg.catch_up_interval > 0 and now - caught_up_at >= cfg.catch_up_interval:
                # A server that joined since the trainer's last broadcast may be the only one left,
                # making groups too stale to train: only the current weights make it useful.
                self._stream.call_all("catch_up", timeout=cfg.request_timeout)
                caught_up_at = time.monotonic()
            # A stall counts from the last completed step: a slow trainer plus a slow wait is one.
            stalled = now - self._t_last_step
            if stalled > cfg.stall_timeout and now - reported_at > cfg.data_log_interval:
                reported_at = last_log = now
                report = stall_report.stall_report(
                    self.ctx.experiment_name,
                    self.ctx.trial_name,
                    replies,
                    self.shares,
                    cfg.expected_workers,
                    secret=self.ctx.secret,
                )
                self.logger.warning(
                    f"stall: no train step completed for {stalled:.0f}s (step {self.step + 1}, "
                    f"version {self.version}); who waits for what:\n  " + "\n  ".join(report)
                )
            elif now - last_log > cfg.data_log_interval:
                last_log = now
                have = sum(min(r["buffered"], self.shares[r["dp_rank"]]) for r in replies)
                # Each rank is fed by its own rollout workers: say which rank waits, not just how many.
                ranks = "; ".join(
                    f"dp rank {r['dp_rank']} holds {r['buffered']}/{self.shares[r['dp_rank']]}" for r in short
                )
                self.logger.info(
                    f"step {self.step + 1}: {have}/{cfg.groups_per_step} groups ready after {waited:.0f}s"
                    + (f" ({ranks})" if len(replies) > 1 else "")
                )
            if self._stop_requested or self._status_says_stop():
                raise WorkerExit(f"stopped while waiting for data: {self._stop_reason}")
            self._stop_if_asked()
            time.sleep(cfg.data_poll_interval)

    def _run_step(self) -> None:
        cfg = self.config
        wait_s = self._wait_for_data()
        take = {head: {"take": s} for head, s in zip(self._heads, self.shares)}
        if cfg.stats.log_completions:
            # DP rank 0 decodes the step's logged samples from its share (realhf.system.stats.completion_log).
            take[0]["completions"] = cfg.stats.log_completions
        fetched = self._stream.call_all("fetch", workers=self._heads, per_worker_data=take, timeout=cfg.request_timeout)
        self._update_stale_dropped(fetched)
        balance = self._balance(fetched)
        inference, train = self._train_calls()
        self.version = train[0]["version"]
        self.step += 1
        self.training_samples += cfg.groups_per_step
        self._publish("training_samples", self.training_samples)

        now = time.monotonic()
        metrics = step_metrics(
            self.step, self.version, fetched, train, inference, self.stale_dropped, now - self._t_last_step, wait_s, self.training_samples,
            agent_extremes=cfg.stats.agent_metric_extremes,
        )  # fmt: skip
        self._t_last_step = now
        metrics["rejected"] = self.rejected
        metrics.update(balance)
        metrics.update(self._admission_metrics())
        self._stats.log(metrics)
        rows = next((r.get("completions", []) for r in fetched if r["dp_rank"] == 0), [])
        if self._completions is not None and rows:
            self._stats.echo_lines(console_lines(rows))
            self._completions.write(self.step, rows)
        qids = [q for r in fetched for q in r["batch"].get("qids", [])]
        self._qids_log.write(self.step, qids)
        self._trained.update(qids)
        self._sync_rollout_records()
        self._save_and_checkpoint()

    def _balance(self, fetched: List[dict]) -> Dict[str, float]:
        """Split the groups the ranks took so each rank trains about the same number of tokens
        (groups stay whole; as few as possible move), tell the ranks (they exchange the groups and
        build their batches), and return the step's balance metrics: tokens per rank max/mean
        before and after, and the share of tokens that moved."""
        by_rank = sorted(fetched, key=lambda r: r["dp_rank"])
        plan = dp_balance.balance([r["group_costs"] for r in by_rank])
        self._stream.call_all("balance", {"assignment": plan.assignment}, timeout=self.config.request_timeout)
        total = max(sum(plan.rank_costs), 1)
        return {
            "dp_token_imbalance": plan.imbalance,
            "dp_token_imbalance_before": plan.imbalance_before,
            "dp_tokens_moved_fraction": plan.moved_cost / total,
            "dp_tokens_max": max(plan.rank_costs),
        }

    def _train_calls(self) -> Tuple[Dict[str, List[Any]], List[Any]]:
        """One train step on the batch the model workers took: the nodes of the step's graph,
        wave by wave. A wave's trainer nodes go to every rank one after another; a node of
        `ppo.graph.own_process` goes to the node worker with each DP rank's inputs first, runs
        beside them, and its outputs are set on the ranks' batches before the next wave.
        Returns (inference replies per model, the actor update's replies, carrying the other
        nodes' stats too: global, the same on every rank)."""
        cfg = self.config
        own = set(cfg.ppo.graph.own_process)
        inference: Dict[str, List[Any]] = {}
        extra_stats: Dict[str, Any] = {}
        train: List[Any] = []
        workers = range(self._stream.n_workers)
        for wave in ppo_step.waves(self.graph):
            here, away = [n for n in wave if n.name not in own], [n for n in wave if n.name in own]
            inputs = []
            if away:  # before the trainer nodes, which would queue this request behind them
                names = sorted({t for n in away for t in n.inputs})
                inputs = self._stream.call_all(
                    "get_tensors", {"names": names}, workers=self._heads, timeout=cfg.request_timeout
                )
            node_worker = self._stream.n_workers  # the first (and only) node worker
            away_ids = [
                self._stream.post(node_worker, "step_node", {"node": n.name, "batches": [r["tensors"] for r in inputs]})
                for n in away
            ]
            per_node = []
            for n in here:
                # One node at a time on the trainer's ranks: a rank that skipped a collective must
                # not run on into the next node's, where it would pair with the others' wrongly
                # instead of leaving them to time out naming the call (realhf.base.collectives).
                replies = self._stream.call_all("step_node", {"node": n.name}, timeout=cfg.request_timeout)
                per_node.append((n, [replies[h] for h in self._heads]))
            replies_away = self._stream.wait(away_ids, cfg.request_timeout * max(len(away), 1))
            last = any(n.op == "train_actor" for n in here)  # the step's batch is gone: nothing reads them
            for n, reply in zip(away, replies_away):
                per_node.append((n, reply["stats"]))
                if not last:  # each DP rank's outputs to every rank of its replica
                    per_worker = {w: {"tensors": reply["outputs"][self._layout.coords(w)[0]]} for w in workers}
                    self._stream.call_all("set_tensors", per_worker_data=per_worker, timeout=cfg.request_timeout)
            for node, replies in per_node:
                # Every rank runs the node; the heads' replies speak for their replicas (the same numbers).
                if node.op == "train_actor":
                    train = replies
                elif "model" in replies[0] and "n_tokens" in replies[0]:
                    inference[replies[0]["model"]] = replies
                else:  # the critic's update, the advantages, a user's node: their numbers
                    for key, value in replies[0].items():
                        if key == "stats" and isinstance(value, dict):
                            extra_stats.update(value)
                        elif isinstance(value, (int, float)) and not isinstance(value, bool):
                            extra_stats[f"{node.name}/{key}"] = value
        train[0]["stats"].update(extra_stats)
        return inference, train

    def _save_and_checkpoint(self) -> None:
        cfg, ctrl = self.config, self.config.exp_ctrl
        last = self.step >= self.total_steps or self._out_of_time()  # `_finish` saves the last step
        by_steps = ctrl.save_freq_steps > 0 and self.step % ctrl.save_freq_steps == 0
        by_secs = ctrl.save_freq_secs > 0 and time.monotonic() - self._t_last_save >= ctrl.save_freq_secs
        if (by_steps or by_secs) and not last:
            path = self._stream.call_all("save", timeout=cfg.request_timeout)[0]["path"]
            self._t_last_save = time.monotonic()
            self.logger.info(f"step {self.step}: saved {path}")
        by_steps = ctrl.ckpt_freq_steps > 0 and self.step % ctrl.ckpt_freq_steps == 0
        by_secs = ctrl.ckpt_freq_secs > 0 and time.monotonic() - self._t_last_ckpt > ctrl.ckpt_freq_secs
        if by_steps or by_secs:
            self._checkpoint()

    def _checkpointing(self) -> bool:
        return self.config.exp_ctrl.ckpt_freq_steps > 0 or self.config.exp_ctrl.ckpt_freq_secs > 0

    def _checkpoint(self) -> None:
        """Trainer state plus what the rest of the system needs to resume consistently: the step
        and sample counters (the manager's admission resumes from them), each rollout worker's
        prompt-sampler position and the prompts drawn but not yet trained or consumed (`pending`,
        run first on resume; kept up to date after every step by `_sync_rollout_records`) — all in
        the model workers' one atomic write (docs/architecture.md §12.3)."""
        cfg = self.config
        pending = [[query_id, qid] for qid, query_id in sorted(self._pending.items())]
        extra = {
            "step": self.step,
            "training_samples": self.training_samples,
            "stale_dropped": self.stale_dropped,
            "rollout_samplers": self._samplers,
            "rollout_pending": pending,
            # A resumed run with rollout.n_workers=0 starts as many: the samplers are per worker.
            "rollout_workers": cfg.expected_workers.get("rollout_worker", 0),
            "saved_at": time.time(),
        }
        path = self._stream.call_all("checkpoint", {"extra": extra}, timeout=cfg.request_timeout)[0]["path"]
        self._t_last_ckpt = time.monotonic()
        self._ckpt_version = self.version
        self.logger.info(
            f"step {self.step}: recovery checkpoint at version {self.version} in {path} "
            f"({len(self._samplers)} rollout sampler positions, {len(pending)} prompts pending)"
        )

    def _sync_rollout_records(self) -> None:
        """After each step: read every rollout worker's record (one get each: its sampler position
        and drawn prompts agree) and update the sampler positions and the pending set,
            pending = (pending before ∪ refused, to-do, in flight, pushed) − consumed − trained − dropped,
        then acknowledge the seq read, so the worker forgets the pushed and consumed entries now
        held here (its record stays one step long). A checkpoint snapshots both: what this
        process holds in memory only matters until the next one, since its death ends the run."""
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        seqs, consumed = {}, set()
        for i in range(self.config.expected_workers.get("rollout_worker", 0)):
            try:
                rec = json.loads(name_resolve.get(names.rollout_record(exp, trial, i)))
            except name_resolve.NameEntryNotFoundError:
                continue  # not started yet: its previous position and pending prompts carry over
            seqs[i] = int(rec["seq"])
            self._samplers[str(i)] = rec["sampler"]
            drawn = ([rec["refused"]] if rec.get("refused") else []) + list(rec.get("todo") or [])
            for part in ("inflight", "pushed"):
                drawn += [[e["query_id"], q] for q, e in (rec.get(part) or {}).items()]
            self._pending.update({qid: str(query_id) for query_id, qid in drawn})
            consumed.update(rec.get("consumed") or {})
        self._pending = {
            q: query_id
            for q, query_id in self._pending.items()
            if q not in consumed and q not in self._trained and q not in self._dropped
        }
        for i, seq in seqs.items():
            name_resolve.add(names.rollout_record_ack(exp, trial, i), str(seq), replace=True, delete_on_exit=False)

    def _admission_metrics(self) -> Dict[str, int]:
        """What the manager's ledger says so far: admissions, and rollouts that ended without a
        group by reason (a group too large to send, a timeout, ...), counted where users look."""
        try:
            state = self._ledger.load()
        except Exception as e:  # noqa: BLE001 - metrics must not end a run; the log says why they are missing
            self.logger.warning(f"admission ledger unreadable: {e}")
            return {}
        out = {
            "groups_admitted": state.admitted - sum(self._accepted_at_start),
            "groups_abandoned": state.abandoned,
            "manager_starts": state.starts,
        }
        out.update({f"groups_ended_{r}": state.ended.get(r, 0) for r in ENDED_REASONS})
        return out

    def _account(self) -> None:
        """At the end: where every admitted group went (realhf.system.manager.admission_ledger), logged
        and written to accounting.json. The ledger is read first, then the DP heads, asked again
        until every group accepted by then has arrived (for ACCOUNT_SETTLE_S at most)."""
        try:
            state = self._ledger.load()
            # A group counted accepted was pushed before, but may still be on its last hop (ZMQ,
            # then the head's pull thread, which polls every 0.1 s): the heads are asked again
            # until every accepted group has arrived, for up to ACCOUNT_SETTLE_S.
            deadline = time.monotonic() + ACCOUNT_SETTLE_S
            while True:
                heads = self._stream.call_all(
                    "fetch", {"take": 0}, workers=self._heads, timeout=self.config.request_timeout
                )
                a = accounting(state, heads, self._accepted_at_start)
                if a["holds"] or time.monotonic() >= deadline:
                    break
                time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - the run itself is done; say what could not be counted
            self.logger.warning(f"no final group accounting: {type(e).__name__}: {e}")
            return
        with open(os.path.join(self.config.log_dir, "accounting.json"), "w") as f:
            json.dump(a, f, indent=1)
        (self.logger.info if a["holds"] else self.logger.error)(
            accounting_line(a) + ("" if a["holds"] else " — ACCOUNTING DOES NOT HOLD")
        )

    def _stop_if_asked(self) -> None:
        """The launcher got SIGTERM/SIGINT (a scheduler's preemption, a Ctrl-C): between steps, or
        while waiting for data, write a recovery checkpoint of the last step (unless the last
        checkpoint is of it), account for every group, say so and end the run; the next start with
        recover_mode=auto continues from step `self.step` + 1. The step in flight, if any, was
        finished first: a step is never half-trained."""
        exp, trial = self.ctx.experiment_name, self.ctx.trial_name
        try:
            signame = name_resolve.get(names.stop_request(exp, trial))
        except name_resolve.NameEntryNotFoundError:
            return
        t0 = time.monotonic()
        fresh = self.step > 0 and getattr(self, "_ckpt_version", None) != self.version
        if fresh:
            self._checkpoint()
        self._account()
        done = {"step": self.step, "version": self.version, "checkpointed": self.step > 0}
        name_resolve.add(names.stopped_resumable(exp, trial), json.dumps(done), replace=True, delete_on_exit=False)
        if self.step == 0:
            what = "nothing trained yet, nothing to checkpoint"
        elif fresh:
            what = f"recovery checkpoint written in {time.monotonic() - t0:.1f}s; recover_mode=auto continues from it"
        else:
            what = "its recovery checkpoint was already there; recover_mode=auto continues from it"
        self.logger.info(f"stopped on {signame} after step {self.step} (version {self.version}): {what}")
        name_resolve.add(names.experiment_status(exp, trial), STATUS_COMPLETE, replace=True, delete_on_exit=False)
        raise WorkerExit(f"stopped on {signame}")

    def _exit_if_asked(self) -> None:
        """SIGTERM/SIGINT came (the launcher is stopping the trial): stop waiting for replies."""
        if self._stop_requested:
            raise WorkerExit(f"{self._stop_reason} while waiting for the model workers")

    def _finish(self, reason: str) -> None:
        if self._checkpointing() and getattr(self, "_ckpt_version", None) != self.version:
            self._checkpoint()  # so that a longer rerun with recover_mode=auto continues from here
        path = self._stream.call_all("save", timeout=self.config.request_timeout)[0]["path"]
        self._account()
        elapsed = time.monotonic() - self._t_start
        self.logger.info(
            f"done ({reason}): {self.step} steps, version {self.version}, {self.training_samples} groups "
            f"trained, {self.stale_dropped} stale-dropped in {elapsed:.1f}s; final weights in {path}"
        )
        name_resolve.add(
            names.experiment_status(self.ctx.experiment_name, self.ctx.trial_name),
            STATUS_COMPLETE,
            replace=True,
            delete_on_exit=False,
        )
        raise WorkerExit("training complete")

    def _exit_hook(self) -> None:
        if getattr(self, "_stats", None) is not None:
            self._stats.close()
        if getattr(self, "_completions", None) is not None:
            self._completions.close()
        if getattr(self, "_qids_log", None) is not None:
            self._qids_log.close()
        if getattr(self, "_stream", None) is not None:
            self._stream.close()
