"""A blocked event loop is detected and reported with its stack (issue 27, item 1): an AsyncWorker
whose loop is held by a blocking call logs where, publishes it for the master's stall report, and
says when the loop runs again. In-process, with the memory name-resolve backend."""

import json
import logging
import time

from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve, names
from realhf.system.master.stall_report import blocked_loop_lines
from realhf.system.worker_base import STATUS_RUNNING, AsyncWorker, WorkerContext

EXP, TRIAL = "watchdog", "t"
KEY = names.loop_blocked(EXP, TRIAL, "rollout_worker", 3)


def _blocking_reward_fn(seen: dict) -> None:
    """Holds the loop (as a synchronous reward function would) until the watchdog has published."""
    deadline = time.monotonic() + 10
    while "published" not in seen and time.monotonic() < deadline:
        time.sleep(0.05)  # BLOCKING LINE
        try:
            seen["published"] = json.loads(name_resolve.get(KEY))
            seen["report"] = blocked_loop_lines(EXP, TRIAL)
        except name_resolve.NameEntryNotFoundError:
            pass
    time.sleep(0.2)


class _BlockedOnce(AsyncWorker):
    loop_block_warn_s = 0.3  # small, so that the test is short

    def _configure(self):
        name_resolve.add(names.experiment_status(EXP, TRIAL), STATUS_RUNNING, replace=True)
        self.seen, self.polls = {}, 0

    async def _poll_async(self) -> bool:
        self.polls += 1
        if self.polls == 1:
            _blocking_reward_fn(self.seen)
        elif self._unblocked_noticed():
            self.request_stop("done")
        return False

    def _unblocked_noticed(self) -> bool:
        try:
            name_resolve.get(KEY)
            return False
        except name_resolve.NameEntryNotFoundError:
            return True


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def test_a_blocked_event_loop_is_logged_with_the_blocking_line_published_and_cleared_when_it_runs_again(caplog):
    ctx = WorkerContext(
        experiment_name=EXP,
        trial_name=TRIAL,
        worker_type="rollout_worker",
        worker_index=3,
        name_resolve=NameResolveConfig(type="memory"),
    )
    worker = _BlockedOnce(ctx)
    try:
        with caplog.at_level(logging.INFO):
            t0 = time.monotonic()
            assert worker.run() == 0
        assert time.monotonic() - t0 < 8
        where = f"{__file__}:{_line_of('BLOCKING LINE')} in _blocking_reward_fn"
        published = worker.seen["published"]
        assert published["where"] == where and published["blocked_for_s"] >= 0.3
        assert worker.seen["report"] == [
            f"rollout_worker/3: event loop blocked for at least "
            f"{published['blocked_for_s']}s at {where}; nothing else on it runs "
            "meanwhile (its log has the stack)"
        ]
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings  # once per blocking (the reminder is a minute away)
        assert "event loop of rollout_worker/3 blocked for" in warnings[0]
        assert f'File "{__file__}", line {_line_of("BLOCKING LINE")}, in _blocking_reward_fn' in warnings[0]
        assert any(
            "event loop of rollout_worker/3 runs again after being blocked for" in r.getMessage()
            and r.levelno == logging.INFO
            for r in caplog.records
        )
        assert blocked_loop_lines(EXP, TRIAL) == []
    finally:
        name_resolve.reconfigure(NameResolveConfig(type="memory"))
