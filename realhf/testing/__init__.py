"""Try your own agent and environment in a test, without a run (docs/your-agent.md):

    from realhf.testing import run_episode, run_group

    out = run_episode(MyAgent, row, env=MyEnv, model="tiny")      # the embedded tiny model, in-process
    out = run_episode(MyAgent, row, env=MyEnv, server="http://127.0.0.1:30000")  # a running /generate
    out.samples[0].reward, out.samples[0].metrics, out.prompt_ids, out.samples[0].output_ids
    group = run_group(MyAgent, row, env=MyEnv, model="tiny", group_size=4)

An episode runs exactly as in a rollout worker (realhf.system.rollout.episode): the row checked as a
dataset row, the prompt encoded with the tools' schemas, a fresh environment per episode, the
agent's reward shaped and its group filtered, the trajectory checked as the trainer would. The
result is that `Trajectory` (realhf.api.trajectory). `ScriptedModel([...])` answers with texts
written in advance, for tests whose assertions must not depend on sampling. Settings:
`max_new_tokens`, `temperature`, `seed`, `timeout`, `agent_args`, `env_args` (checked as
`rollout.agent.args` / `rollout.env.args` are), `tokenizer`, `chat_template`
(realhf.testing.episodes.arun_group).
"""

from realhf.testing.episodes import arun_episode, arun_group, run_episode, run_group
from realhf.testing.models import InProcessModel, ScriptedModel, ServerModel

__all__ = [
    "run_episode",
    "run_group",
    "arun_episode",
    "arun_group",
    "ScriptedModel",
    "InProcessModel",
    "ServerModel",
]
