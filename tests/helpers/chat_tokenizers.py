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
