"""A rollout worker's rules for failed episodes (realhf.system.rollout.episode_failures)."""

from realhf.base.user_code import ErrorReport
from realhf.system.rollout.episode_failures import FailureStreak, ReportedSites

TGT = ErrorReport("KeyError", "'tgt'", "my_agent.py:12 in run_episode", True)


def test_a_streak_of_one_error_at_one_line_is_one_error():
    streak = FailureStreak(limit=3)
    for _ in range(3):
        streak.failed(TGT)
    assert streak.exhausted and streak.one_error() == TGT


def test_a_streak_of_different_errors_is_not_one_error_so_the_worker_is_restarted_as_before():
    streak = FailureStreak(limit=3)
    for key in ("'a'", "'b'", "'a'"):
        streak.failed(ErrorReport("KeyError", key, TGT.where, True))
    assert streak.exhausted and streak.one_error() is None


def test_a_success_ends_the_streak():
    streak = FailureStreak(limit=2)
    streak.failed(ErrorReport("ValueError", "flaky", "", False))
    streak.succeeded()
    streak.failed(TGT)
    assert not streak.exhausted and streak.n == 1 and streak.one_error() == TGT


def test_each_place_is_reported_once_whatever_its_messages_and_only_so_many_places():
    sites = ReportedSites(limit=2)
    assert sites.first_time(TGT)
    assert not sites.first_time(ErrorReport("KeyError", "'other'", TGT.where, True))  # same type, same line
    assert sites.first_time(ErrorReport("ValueError", "x", TGT.where, True))
    assert not sites.first_time(ErrorReport("TypeError", "x", "b.py:1 in g", True))  # over the limit
