"""Model workers started as real processes by the LocalLauncher, with the test playing the master
(MasterStream) and the rollout workers (a ZMQ pusher per DP head), all on real Redis."""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

from helpers import shared_template
from realhf.api.cli_args import NameResolveConfig
from realhf.api.worker_configs import ModelWorkerConfig
from realhf.base import name_resolve, names
from realhf.scheduler.local import LocalLauncher, WorkerSpec
from realhf.system.streams.push_pull_stream import ZMQPusher
from realhf.system.streams.request_reply_stream import MasterStream
from realhf.system.worker_base import STATUS_COMPLETE

EXP = "train-test"


class ModelWorkerHarness:
    def __init__(self, fileroot: str, trial: str, n_workers: int, config: ModelWorkerConfig, redis_url: str):
        self.trial, self.n = trial, n_workers
        self.launcher = LocalLauncher(
            EXP,
            trial,
            fileroot,
            NameResolveConfig(type="redis", redis_url=redis_url),
            startup_timeout=120,
            exit_grace=10,
            worker_template=shared_template.address(),
        )
        self.stream = None
        self.pushers: Dict[int, ZMQPusher] = {}
        try:
            self.launcher.start()
            self.stream = MasterStream(EXP, trial, n_workers, secret=self.launcher.secret)
            self.launcher.submit(WorkerSpec("model_worker", n_workers, configs=[config] * n_workers))
            self.stream.wait_for_workers(timeout=120)
            self.init_replies = self.stream.call_all("initialize", timeout=120)
        except BaseException:
            self.close(complete=False)
            raise

    def push(self, rank: int, msgs: Sequence[dict]) -> None:
        if rank not in self.pushers:
            address = name_resolve.wait(names.stream_puller(EXP, self.trial, rank), timeout=60)
            self.pushers[rank] = ZMQPusher(address, send_timeout=30, secret=self.launcher.secret)
        for m in msgs:
            self.pushers[rank].push(m)

    def fetch_until(self, shares: List[int], timeout: float = 60) -> List[dict]:
        deadline = time.monotonic() + timeout
        while True:
            replies = self.stream.call_all("fetch", {"take": 0}, timeout=60)
            if all(r["buffered"] >= shares[r["dp_rank"]] for r in replies):
                return replies
            assert time.monotonic() < deadline, f"trajectories never arrived: {replies}"
            time.sleep(0.1)

    def step(self, shares: List[int], assignment: Optional[list] = None) -> dict:
        """One training step the way the master runs it: take, balance (by `assignment`: per rank,
        the (source rank, index) of each group it trains; default: each keeps what it took),
        the step graph's nodes actor_inf, advantages, actor_train."""
        self.fetch_until(shares)
        fetched = self.stream.call_all(
            "fetch", per_worker_data={i: {"take": s} for i, s in enumerate(shares)}, timeout=60
        )
        if assignment is None:
            assignment = [[(r, i) for i in range(s)] for r, s in enumerate(shares)]
        balanced = self.stream.call_all("balance", {"assignment": assignment}, timeout=60)
        inference = self.stream.call_all("step_node", {"node": "actor_inf"}, timeout=120)
        self.stream.call_all("step_node", {"node": "advantages"}, timeout=60)
        train = self.stream.call_all("step_node", {"node": "actor_train"}, timeout=300)
        return {"fetch": fetched, "balance": balanced, "inference": inference, "train": train}

    def model_version(self) -> str:
        return name_resolve.get(names.model_version(EXP, self.trial, "actor"))

    def close(self, complete: bool = True) -> None:
        try:
            if complete:
                name_resolve.add(names.experiment_status(EXP, self.trial), STATUS_COMPLETE, replace=True)
                self.launcher.wait(timeout=60)
        finally:
            for p in self.pushers.values():
                p.close()
            if self.stream is not None:
                self.stream.close()
            self.launcher.stop_all()
