"""Issue 29, item 5: an error in the user's code is said on the launcher's console — its type,
message and the user's file:line — once; and one that every episode repeats ends the run at once.

A user measured the old way: an agent reading a field its rows do not have raised KeyError in
every episode; each rollout worker gave up after 20 failures in a row, was restarted three times
(the same error each time), and the run ended with `RuntimeError: 20 episodes failed in a row;
last: 'tgt'` — the type and the line only in a worker's log. Here the same agent
(`helpers.faulty_plugins:MissingFieldAgent`) runs through the real system."""

import inspect
import os
import re
from datetime import datetime, timedelta

import pytest

from helpers import faulty_plugins
from helpers.paths import REPO, TESTS_DIR
from helpers.training_runs import SMALL_RUN, run_training

# REPO first: this checkout's realhf in the launcher too (the workers import it from the cwd).
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, TESTS_DIR]))
# Restarting the rollout worker three times would take the restart backoff alone (1 + 2 + 4 s)
# plus three worker start-ups (~5-15 s each on a 2-core machine: torch, the tokenizer, the agent).
ENDS_WITHIN_S = 30


def _line_of(cls, text: str) -> int:
    lines, first = inspect.getsourcelines(cls)
    return first + next(i for i, line in enumerate(lines) if text in line)


def _first_failure_time(log: str) -> datetime:
    stamp = re.search(r"(\d\d:\d\d:\d\d\.\d\d\d) ERROR rollout_worker/\d+: failed \(1 in a row\)", log).group(1)
    now = datetime.now()
    t = datetime.combine(now.date(), datetime.strptime(stamp, "%H:%M:%S.%f").time())
    return t - timedelta(days=1) if t > now else t


@pytest.mark.e2e
def test_a_deterministic_error_in_the_users_agent_is_said_once_on_the_console_and_ends_the_run_at_once(
    tmp_path, no_leftover_processes
):
    proc, metrics, log_dir = run_training(
        tmp_path,
        "keyerror",
        "exp_ctrl.benchmark_steps=3",
        *SMALL_RUN,  # one rollout worker
        "rollout.agent.type=helpers.faulty_plugins:MissingFieldAgent",
        timeout=300,
        env=ENV,
    )
    ended = datetime.now()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert metrics == []
    line = _line_of(faulty_plugins.MissingFieldAgent, 'target = row["tgt"]')
    where = f"tests/helpers/faulty_plugins.py:{line} in run_episode"
    error = f"KeyError: 'tgt' at {where}"
    # Said once when it first happened (not per episode), then as the reason the run ended.
    assert out.count("error in user code (episode ") == 1 and error in proc.stdout, out[-4000:]
    assert re.search(
        r"run failed \(exit 1\): worker rollout_worker/0 failed \d+ episodes in a row with one error in user "
        rf"code, which a restart would only repeat: {re.escape(error)}",
        proc.stderr,
    ), proc.stderr[-4000:]
    assert 'target = row["tgt"]' in proc.stderr  # its traceback, down to the user's line
    # Not restarted: no restart in the launcher's output, one incarnation in the worker's log.
    assert "restart" not in out.replace("restart would only repeat", ""), out[-4000:]
    log = (log_dir / "rollout_worker-0.log").read_text(errors="replace")
    assert log.count("configured; running") == 1 and "exiting with code 78" in log
    since_first_failure = (ended - _first_failure_time(log)).total_seconds()
    assert since_first_failure < ENDS_WITHIN_S, since_first_failure
