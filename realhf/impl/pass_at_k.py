"""Sampled accuracy and pass@k of a model on math prompts, from one pass of k answers per prompt.

Accuracy is the fraction of all answers graded right (what `evaluate_math_accuracy` reports);
pass@k the fraction of prompts with at least one right answer among their k (from its
`correct_per_prompt`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Sequence, Union

from realhf.api.prompt import PromptRow
from realhf.impl.environment.math_grader import MathGrader
from realhf.impl.evaluation import GenerateFn, evaluate_math_accuracy


def pass_at_k(correct_per_prompt: Sequence[int]) -> float:
    """Fraction of prompts with at least one right answer."""
    if not correct_per_prompt:
        raise ValueError("pass@k of no prompts")
    return sum(c > 0 for c in correct_per_prompt) / len(correct_per_prompt)


def accuracy_and_pass_at_k(
    tokenizer_path: Union[str, Path],
    rows: Sequence[PromptRow],
    k: int,
    *,
    temperature: float,
    max_new_tokens: int,
    generate_fn: GenerateFn,
    grader: MathGrader,
    chat_template: str = "auto",
) -> Dict[str, float]:
    """`evaluate_math_accuracy`'s result for k answers per prompt, plus "pass_at_k" and "k"."""
    result = evaluate_math_accuracy(
        tokenizer_path,
        rows,
        temperature=temperature,
        n=k,
        max_new_tokens=max_new_tokens,
        generate_fn=generate_fn,
        grader=grader,
        chat_template=chat_template,
    )
    return {**result, "pass_at_k": pass_at_k(result["correct_per_prompt"]), "k": k}
