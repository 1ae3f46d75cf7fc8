"""Accuracy of a model on math prompts: generate, extract the final answer, grade.

Generation is pluggable: by default HF `generate` (batched, left-padded); any engine can be
used instead by passing `generate_fn(prompts_token_ids, temperature, max_new_tokens)` that
returns the new token ids of each prompt (EOS may be included; anything after it is ignored).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from realhf.api.prompt import PromptRow
from realhf.impl.dataset.prompt_encoding import chat_template_on, encode_prompt
from realhf.plugins.environments.math_grader import MathGrader

GenerateFn = Callable[[List[List[int]], float, int], List[List[int]]]


def hf_generate_fn(model: torch.nn.Module, pad_id: int, eos_id: int, batch_size: int = 64) -> GenerateFn:
    """A `GenerateFn` over HF `generate`: greedy at temperature 0, else pure sampling (no top-k or
    top-p, so "sampled accuracy" means the same as the RL sampler's)."""

    @torch.no_grad()
    def generate(prompts: List[List[int]], temperature: float, max_new_tokens: int) -> List[List[int]]:
        sampling = temperature > 0
        gen_cfg = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=sampling,
            temperature=temperature if sampling else None,
            top_k=0 if sampling else None,
            top_p=1.0 if sampling else None,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
        )
        model.eval()
        out: List[List[int]] = []
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i : i + batch_size]
            width = max(len(p) for p in chunk)
            # Left padding keeps every prompt's last token at the same position.
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            seqs = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen_cfg)
            out.extend(seqs[:, width:].tolist())
        return out

    return generate


def engine_generate_fn(
    model_path: Union[str, Path], slots: int = 128, threads: int = 1, seed: int = 1, timeout: float = 1800.0
) -> GenerateFn:
    """A `GenerateFn` over the native engine (realhf.impl.inference) in this process: `slots`
    answers decoded together, a finished one's slot refilled at once, so answers of very different
    lengths cost their own tokens, not the longest one's (HF `generate` keeps stepping finished
    rows until its batch's last answer ends). Pure sampling at temperature > 0, greedy at 0."""

    def generate(prompts: List[List[int]], temperature: float, max_new_tokens: int) -> List[List[int]]:
        from realhf.impl.inference.factory import create_engine
        from realhf.impl.inference.request import GenerateRequest, SamplingParams

        context = max(len(p) for p in prompts) + max_new_tokens
        engine = create_engine(
            str(model_path), max_running_requests=slots, context_length=context, n_threads=threads, seed=seed
        ).start()
        try:
            sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
            futures = engine.submit_many([GenerateRequest(list(p), sampling) for p in prompts])
            return [list(f.result(timeout=timeout).output_ids) for f in futures]
        finally:
            engine.stop()

    return generate


def _until_eos(ids: Sequence[int], eos_id: int) -> List[int]:
    ids = list(ids)
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def evaluate_math_accuracy(
    model_path: Union[str, Path],
    rows: Sequence[PromptRow],
    *,
    temperature: float = 0.0,
    n: int = 1,
    max_new_tokens: int = 32,
    batch_size: int = 64,
    generate_fn: Optional[GenerateFn] = None,
    grader: Optional[MathGrader] = None,
    seed: int = 1,
    chat_template: str = "auto",
    keep_answers: bool = False,
) -> Dict[str, float]:
    """Fraction of `n` samples per prompt whose answer matches a reference solution.

    Returns {"accuracy", "n" (graded samples), "n_prompts", "n_correct", "correct_per_prompt"
    (right answers of each row, of `n`), "temperature", "mean_new_tokens", "truncated" (fraction
    that hit max_new_tokens without EOS)}, and with `keep_answers` "answers": per row, its `n`
    (answer text, right) pairs.
    The tokenizer always comes from `model_path`; the model is loaded only when no
    `generate_fn` is given. `seed` fixes torch's sampling RNG.
    """
    if not rows:
        raise ValueError("evaluate_math_accuracy needs at least one row")
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if generate_fn is None:
        transformers.utils.logging.disable_progress_bar()  # a tqdm bar per load in the run's report
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32, use_safetensors=True)
        generate_fn = hf_generate_fn(model, pad_id=pad_id, eos_id=eos_id, batch_size=batch_size)

    chat = chat_template_on(chat_template, tokenizer)  # as the rollout workers encode them
    prompts = [encode_prompt(tokenizer, r.as_dict(), chat) for r in rows for _ in range(n)]
    torch.manual_seed(seed)
    outputs = generate_fn(prompts, temperature, max_new_tokens)
    if len(outputs) != len(prompts):
        raise ValueError(f"generate_fn returned {len(outputs)} outputs for {len(prompts)} prompts")

    own_grader = grader is None
    grader = grader or MathGrader()
    try:
        n_correct, n_tokens, n_truncated = 0, 0, 0
        per_prompt = [0] * len(rows)
        answers: List[List[tuple]] = [[] for _ in rows]
        for k, out in enumerate(outputs):
            row = rows[k // n]
            answer = _until_eos(out, eos_id)
            n_tokens += len(answer)
            n_truncated += len(answer) == len(out) and len(out) >= max_new_tokens
            text = tokenizer.decode(answer, skip_special_tokens=True)
            right = bool(grader.grade(text, row.solutions))
            n_correct += right
            per_prompt[k // n] += right
            answers[k // n].append((text, right))
    finally:
        if own_grader:
            grader.close()
    total = len(outputs)
    out = {
        "accuracy": n_correct / total,
        "n": total,
        "n_prompts": len(rows),
        "n_correct": n_correct,
        "correct_per_prompt": per_prompt,
        "temperature": temperature,
        "mean_new_tokens": n_tokens / total,
        "truncated": n_truncated / total,
    }
    if keep_answers:
        out["answers"] = answers
    return out
