"""A user environment that cannot start: what a bug in a user's plugin looks like to the system."""

from realhf.api.env import Environment


class BrokenEnv(Environment):
    def __init__(self, config=None, **kwargs):
        raise RuntimeError("BrokenEnv: the user's environment failed to start (on purpose)")

    async def step(self, action):
        raise NotImplementedError
