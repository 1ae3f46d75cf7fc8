"""A rollout worker's rules for failed episodes: when to give up, whether a new process would
only fail the same way, and which errors are news worth telling the user.

- **Give up** after `limit` failed episodes in a row (`rollout.max_consecutive_failures`): a worker
  whose every episode fails is broken, and the launcher's restart policy gets a fresh process.
- **Do not restart** when every failure of that streak was one error — the same type and message
  raised at the same line of the user's code (`ErrorReport.fingerprint`). Such an error is
  deterministic: a restarted worker would fail the same episodes the same way, three restarts
  later the run would fail anyway, and the error would reach the user only as "20 episodes failed
  in a row". Errors that differ (a flaky service, messages naming different rows) keep the
  restart: a new process may well get past them.
- **Tell once** per place: the first error of each type from each line is worth the user's
  console; the 500th episode failing there is not (each one stays in the worker's log).
"""

from __future__ import annotations

from typing import Optional, Set, Tuple

from realhf.base.user_code import ErrorReport

# Places a worker reports at most: errors whose lines differ without end (generated code) must
# not flood the console; the log still has every one.
MAX_REPORTED_SITES = 10


class FailureStreak:
    """Failed episodes in a row, and whether they were all one error."""

    def __init__(self, limit: int):
        self.limit = limit
        self.n = 0
        self._first: Optional[ErrorReport] = None
        self._same = True

    def failed(self, report: ErrorReport) -> None:
        self.n += 1
        if self.n == 1:
            self._first, self._same = report, True
        elif report.fingerprint != self._first.fingerprint:
            self._same = False

    def succeeded(self) -> None:
        self.n, self._first, self._same = 0, None, True

    @property
    def exhausted(self) -> bool:
        return self.n >= self.limit

    def one_error(self) -> Optional[ErrorReport]:
        """The error every failure of the streak was, if they were all one; else None."""
        return self._first if self.n and self._same else None


class ReportedSites:
    """Which (error type, user line) places were already reported."""

    def __init__(self, limit: int = MAX_REPORTED_SITES):
        self.limit = limit
        self._seen: Set[Tuple[str, str]] = set()

    def first_time(self, report: ErrorReport) -> bool:
        """True the first time an error from this place is seen (and while under the limit)."""
        if report.site in self._seen or len(self._seen) >= self.limit:
            return False
        self._seen.add(report.site)
        return True
