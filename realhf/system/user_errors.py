"""Errors in user code, from the worker that saw them to the launcher's console.

A rollout worker runs the user's agent, environment and reward function; what they raise ends
up in that worker's log, which the user does not watch (the launcher echoes only the master's).
So the worker also publishes a record under `user_errors/<type>/<index>/<uuid>` (name resolve,
kept after the worker exits): one for the first error from each place in the user's code
(`fatal: false`), and one when such an error ends the run (`fatal: true`, with the reason). The
launcher (`UserErrorFeed`) prints each place once, whichever worker or incarnation saw it, and
takes a fatal record's reason as the run's failure.

    {"worker": "rollout_worker/0", "context": "episode q7@0 (agent …, env …)", "fatal": false,
     "reason": "", "report": {"type", "message", "where", "by_user", "traceback"}}
"""

from __future__ import annotations

import json
from typing import Callable, Dict, List, Optional, Set, Tuple

from realhf.base import logging, name_resolve, names
from realhf.base.user_code import ErrorReport

logger = logging.getLogger("user_errors")


def publish(ctx, report: ErrorReport, context: str, fatal: bool = False, reason: str = "") -> None:
    """Record `report` for the launcher (best effort: a report must not fail the worker)."""
    value = {
        "worker": f"{ctx.worker_type}/{ctx.worker_index}",
        "context": context,
        "fatal": fatal,
        "reason": reason,
        "report": report.to_dict(),
    }
    parent = names.user_errors(ctx.experiment_name, ctx.trial_name, ctx.worker_type, ctx.worker_index)
    try:
        # Kept on exit: a fatal record is read after the worker is gone.
        name_resolve.add_subentry(parent, json.dumps(value), delete_on_exit=False)
    except Exception as e:  # noqa: BLE001 - Redis trouble is reported by the status checks
        logger.warning(f"could not publish an error report under {parent}: {type(e).__name__}: {e}")


def console_line(record: dict) -> str:
    report = ErrorReport.from_dict(record["report"])
    return (
        f"{record['worker']}: error in user code ({record['context']}): {report.one_line()}\n"
        f"  (said once; each later failure from that line is only in {record['worker'].replace('/', '-')}.log)\n"
    )


class UserErrorFeed:
    """The launcher's reader: new records since the last `poll`, each place printed once."""

    def __init__(self, experiment: str, trial: str, call: Callable = lambda what, fn, *a: fn(*a)):
        self.root = names.user_errors_root(experiment, trial)
        self._call = call  # the supervisor's Redis wrapper (a lost Redis fails the run, named)
        self._read: Set[str] = set()
        self._told: Set[Tuple[str, str]] = set()
        self._fatal: Dict[str, dict] = {}  # worker -> its fatal record

    def poll(self) -> List[str]:
        """Console lines for the places not told yet."""
        lines = []
        for key in self._call("reading error reports", name_resolve.find_subtree, self.root):
            if key in self._read:
                continue
            self._read.add(key)
            try:
                record = json.loads(self._call("reading an error report", name_resolve.get, key))
                site = ErrorReport.from_dict(record["report"]).site
            except (name_resolve.NameEntryNotFoundError, ValueError, KeyError, TypeError):
                continue  # gone meanwhile, or not a record
            if record.get("fatal"):
                self._fatal[record["worker"]] = record
            elif site not in self._told:
                self._told.add(site)
                lines.append(console_line(record))
        return lines

    def fatal(self, worker: str) -> Optional[dict]:
        """The record with which `worker` ended the run, if one was read (`poll` first)."""
        return self._fatal.get(worker)
