"""A user environment that cannot start: what a bug in a user's plugin looks like to the system."""

from realhf.api.env import Environment


class BrokenEnv(Environment):
    @classmethod
    def open_shared(cls, config, **kwargs):
        raise RuntimeError("BrokenEnv: the user's environment failed to start (on purpose)")

    async def step(self, action):
        raise NotImplementedError
