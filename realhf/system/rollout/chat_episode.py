"""One episode seen as a chat conversation, for agents that speak the OpenAI chat API.

Each request carries the whole conversation so far. `ChatEpisode.complete` checks that it
extends what this episode already has — the messages of the previous request and the assistant
reply it got — and turns only the new messages into tokens (`Gen.append`, no loss), so the
model's earlier replies stay the tokens it generated, never re-rendered. The first request sets
the episode's prompt (`Gen.set_prompt`). Messages go through the tokenizer's chat template (with
the request's tools); a tokenizer without one joins the messages' contents as plain text.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Dict, List, Optional, Tuple

from realhf.api.agent import Completion
from realhf.api.tools import TOOL_CALL, parse_tool_calls
from realhf.impl.dataset.prompt_encoding import has_chat_template, render_chat
from realhf.system.rollout.episode import AgentError, Gen

Message = Dict[str, Any]


class ConversationError(AgentError):
    """A request that does not extend the episode's conversation (answered 400)."""


def _content(message: Message) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _same(a: Message, b: Message) -> bool:
    return a.get("role") == b.get("role") and _content(a) == _content(b)


class ChatEpisode:
    def __init__(self, gen: Gen, tokenizer: Any):
        self.gen, self.tokenizer = gen, tokenizer
        self.messages: List[Message] = []  # every message so far, the assistant replies included
        self.n_requests = 0

    def _render(self, messages: List[Message], tools: Optional[List[dict]], first: bool) -> List[int]:
        if has_chat_template(self.tokenizer):
            if first:
                return render_chat(self.tokenizer, messages, add_generation_prompt=True, tools=tools)
            return self.gen.append(messages)  # as the template continues a conversation
        ids = list(self.tokenizer("".join(_content(m) for m in messages), add_special_tokens=False)["input_ids"])
        return ids if first else self.gen.append(ids)

    async def complete(
        self, messages: List[Message], tools: Optional[List[dict]] = None, **sampling: Any
    ) -> Tuple[Completion, Message, str]:
        """Generate the assistant's reply to `messages`; returns (completion, the reply as an
        OpenAI message, finish_reason)."""
        if not messages:
            raise ConversationError("messages is empty")
        known = len(self.messages)
        if known:
            if len(messages) <= known or not all(_same(a, b) for a, b in zip(messages[:known], self.messages)):
                raise ConversationError(
                    f"the messages do not extend this episode's conversation: the first {known} must be the earlier "
                    "request's messages and the reply it got, followed by at least one new message"
                )
            self._render(messages[known:], tools, first=False)
        else:
            self.gen.set_prompt(self._render(messages, tools, first=True))
        completion = await self.gen(**sampling)
        self.n_requests += 1
        reply, finish = self._reply(completion)
        self.messages = list(messages) + [reply]
        return completion, reply, finish

    @staticmethod
    def _reply(completion: Completion) -> Tuple[Message, str]:
        calls, _ = parse_tool_calls(completion.text)
        if not calls:
            return {"role": "assistant", "content": completion.text}, "length" if completion.no_eos else "stop"
        content = re.sub(TOOL_CALL, "", completion.text).strip() or None
        return (
            {
                "role": "assistant",
                "content": content,
                "tool_calls": [
                    {
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in calls
                ],
            },
            "tool_calls",
        )
