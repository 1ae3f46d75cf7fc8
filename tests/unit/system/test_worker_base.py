"""A worker reads a lost experiment status as a failure naming Redis, never as "stop" (issue 14,
item 5): against the session's real redis-server."""

import logging

import pytest

from realhf.base import name_resolve, names
from realhf.system.worker_base import STATUS_RUNNING, Worker, WorkerContext

pytestmark = pytest.mark.system


class _DeletesTheStatusKey(Worker):
    """Runs a few polls, then the trial's status key vanishes (Redis flushed, restarted empty)."""

    polls = 0

    def _poll(self) -> bool:
        self.polls += 1
        if self.polls == 3:
            name_resolve.delete(names.experiment_status(self.ctx.experiment_name, self.ctx.trial_name))
        return True


def _ctx(config) -> WorkerContext:
    return WorkerContext(
        experiment_name="wb", trial_name="lost", worker_type="dummy", name_resolve=config, status_check_interval=0.0
    )


def test_a_missing_status_key_fails_the_worker_naming_redis(redis_name_resolve, caplog):
    name_resolve.add(names.experiment_status("wb", "lost"), STATUS_RUNNING, replace=True, delete_on_exit=False)
    worker = _DeletesTheStatusKey(_ctx(redis_name_resolve))
    with caplog.at_level(logging.ERROR):
        code = worker.run()
    assert code == 1  # not 0: a run must never end "successfully" with fewer steps than asked
    assert worker.polls == 3
    text = caplog.text
    assert "experiment status key" in text and "missing from Redis at redis://:***@" in text
    assert "realhf-test" not in text  # the URL is named, its password is not


def test_a_status_other_than_running_still_ends_the_worker_normally(redis_name_resolve):
    name_resolve.add(names.experiment_status("wb", "lost"), "COMPLETE", replace=True, delete_on_exit=False)
    assert _DeletesTheStatusKey(_ctx(redis_name_resolve)).run() == 0
