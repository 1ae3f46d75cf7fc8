"""A model's greedy answers straight from a native engine: what evaluation tests check the
evaluation's episodes against, generated apart from them."""

from typing import List, Sequence

from realhf.impl.dataset.prompt_encoding import chat_template_on, encode_prompt
from realhf.impl.inference.factory import create_engine
from realhf.impl.inference.request import GenerateRequest, SamplingParams


def greedy_answers(model_path: str, rows: Sequence[dict], max_new_tokens: int = 32) -> List[str]:
    """The decoded greedy answer to each row's prompt, encoded as the rollout workers encode it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    chat = chat_template_on("auto", tokenizer)
    engine = create_engine(model_path, max_running_requests=len(rows)).start()
    try:
        sampling = SamplingParams(max_new_tokens, temperature=0.0)
        futures = [engine.submit(GenerateRequest(encode_prompt(tokenizer, r, chat), sampling)) for r in rows]
        return [tokenizer.decode(f.result(60).output_ids, skip_special_tokens=True) for f in futures]
    finally:
        engine.stop()
