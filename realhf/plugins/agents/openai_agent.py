"""The `openai-agent`: agent code written against the `openai` client, run as an episode.

    # my_pkg/workflows.py
    async def solve(client, row):                      # client: openai.AsyncOpenAI
        reply = await client.chat.completions.create(
            model="realhf", messages=[{"role": "user", "content": row["prompt"]}])
        return 1.0 if reply.choices[0].message.content.strip().endswith(row["answer"]) else -1.0

    rollout.agent.type=openai-agent +rollout.agent.args.workflow=my_pkg.workflows:solve

Every call the workflow makes goes to this episode's OpenAI-compatible endpoint
(`gen.openai_endpoint`, served by `realhf/system/rollout/openai_server.py`) and is generated through realhf — admission, routing,
versions, partial rollouts — with its tokens recorded for training. The workflow's return value is
the episode's reward (a number, True/False for ±1, an Outcome, or None to drop the sample).
Needs the `openai` package (pip install 'realhf[openai]').
"""

from __future__ import annotations

import importlib.util
from typing import Any, Dict

from realhf.api.agent import Agent, EpisodeResult, register_agent
from realhf.base.importing import import_object


@register_agent("openai-agent")
class OpenAIAgent(Agent):
    def __init__(self, config: Any = None, *, workflow: str = "", request_timeout: float = 600.0, **kwargs: Any):
        super().__init__(config, **kwargs)
        if not workflow:
            raise ValueError("openai-agent needs rollout.agent.args.workflow='module:async_function(client, row)'")
        if importlib.util.find_spec("openai") is None:
            raise ImportError("openai-agent needs the openai package: pip install 'realhf[openai]'")
        self.workflow = import_object(workflow, "rollout.agent.args.workflow")
        self.request_timeout = float(request_timeout)

    async def run_episode(self, row: Dict[str, Any], gen: Any, env: Any) -> EpisodeResult:
        import openai

        async with gen.openai_endpoint(self.tokenizer) as (base_url, api_key):
            client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=self.request_timeout)
            try:
                return await self.workflow(client, row)
            finally:
                await client.close()
