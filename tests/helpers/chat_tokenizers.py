"""The tiny model's tokenizer with a chat template of the kind real models ship (the tiny model
has none): ChatML as Qwen's and SmolLM2's, and ChatML with Hermes-style tools as Qwen2.5's."""

from helpers.trajectories import TINY_SFT

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] or '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HERMES = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n"
    "{% endif %}" + CHATML
)


def tiny_tokenizer(chat_template: str = ""):
    """A fresh tiny-model tokenizer, with `chat_template` set when given."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY_SFT)
    if chat_template:
        tok.chat_template = chat_template
    return tok


# Abbreviations of real templates' tool-call parts (the real files are not in the test
# environment): Llama 3.1's JSON tool calls (`{"name": ..., "parameters": ...}`, and
# `<|python_tag|>` for its built-in tools) and Mistral v0.3's `[TOOL_CALLS][...]`.
LLAMA3_JSON = (
    "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{% if builtin_tools is defined and c.function.name in builtin_tools %}"
    "{{ '<|python_tag|>' + c.function.name + '.call(...)' }}"
    "{% else %}{{ '{\"name\": \"' + c.function.name + '\", \"parameters\": ' + (c.function.arguments | tojson) + '}' }}"
    "{% endif %}{% endfor %}<|eom_id|>"
    "{% else %}{{ m['content'] }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS][{% for c in m.tool_calls %}"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{% if not loop.last %}, {% endif %}"
    "{% endfor %}]</s>"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}"
)
# A response template (transformers' response parsing) for the Hermes format, as a tokenizer
# that declares its format carries it.
HERMES_RESPONSE = {
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "content": {},
        "tool_calls": {"open": "<tool_call>", "close": "</tool_call>", "content": "json", "repeats": True},
    },
}
