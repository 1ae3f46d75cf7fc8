"""The rollout tests run against real Redis with their trial cleared before and after."""

import pytest

from realhf.base import name_resolve, names
from rollout_helpers import EXP, TRIAL


@pytest.fixture
def nr(redis_name_resolve):
    """Real Redis name resolve with this module's trial cleared before and after."""
    name_resolve.clear_subtree(names.trial_root(EXP, TRIAL))
    yield
    name_resolve.clear_subtree(names.trial_root(EXP, TRIAL))
