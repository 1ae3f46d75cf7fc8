"""How a prompt row becomes the token ids an episode (or an evaluation) starts from.

`dataset.chat_template`: "auto" applies the tokenizer's chat template when it has one, "on"
requires one, "off" encodes the `prompt` text as it is. A row with chat `messages` always goes
through the template (a tokenizer without one is an error naming the row).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from realhf.api.choices import CHAT_TEMPLATE_SETTINGS


class PromptEncodingError(ValueError):
    pass


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_template_on(setting: str, tokenizer: Any) -> bool:
    """Whether `dataset.chat_template=setting` applies the template with this tokenizer."""
    if setting not in CHAT_TEMPLATE_SETTINGS:
        raise PromptEncodingError(f"dataset.chat_template={setting!r}: choose one of {list(CHAT_TEMPLATE_SETTINGS)}")
    if setting == "on" and not has_chat_template(tokenizer):
        raise PromptEncodingError(
            f"dataset.chat_template=on but the tokenizer ({getattr(tokenizer, 'name_or_path', '?')}) "
            "has no chat template; use auto or off"
        )
    return setting == "on" or (setting == "auto" and has_chat_template(tokenizer))


def render_chat(
    tokenizer: Any,
    messages: List[Dict[str, Any]],
    add_generation_prompt: bool,
    tools: Optional[List[Dict[str, Any]]] = None,
) -> List[int]:
    """The chat template's tokens for `messages` (rendered to text, then encoded as is: the
    template's own special tokens stay, none are added); `tools`: function schemas the template
    describes to the model (Hermes/Qwen templates put them in the system turn)."""
    text = tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_text(tokenizer: Any, row: Dict[str, Any], chat: bool, tools: Optional[List[Dict[str, Any]]] = None) -> str:
    """The text an episode of `row` starts from, before tokenisation (`encode_prompt`): its
    `messages` through the chat template, or its `prompt` text — through the template as one
    user message when `chat` is on. `tools` (function schemas) need the template: without one
    they cannot be shown to the model."""
    if tools and not (chat or row.get("messages") is not None):
        raise PromptEncodingError(
            f"the agent offers tools ({', '.join(t['function']['name'] for t in tools)}) but "
            "prompts are not chat-templated (dataset.chat_template, or a tokenizer without a "
            "template): the model would never see their schemas"
        )
    if row.get("messages") is not None:
        if not has_chat_template(tokenizer):
            raise PromptEncodingError(
                f"row {row.get('query_id')!r} has chat 'messages' but the tokenizer has no "
                "chat template; give the row a 'prompt' text, or use a model with a template"
            )
        messages = list(row["messages"])
    elif chat:
        messages = [{"role": "user", "content": row["prompt"]}]
    else:
        return row["prompt"]
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)


def encode_prompt(
    tokenizer: Any, row: Dict[str, Any], chat: bool, tools: Optional[List[Dict[str, Any]]] = None
) -> List[int]:
    """The token ids an episode of `row` starts from (`prompt_text`, encoded as is: a template's
    own special tokens stay, none are added)."""
    return list(tokenizer(prompt_text(tokenizer, row, chat, tools), add_special_tokens=False)["input_ids"])
