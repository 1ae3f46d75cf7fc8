"""pass@k from one pass of k answers per prompt: the fraction of prompts with at least one
success among their k (realhf.system.evaluator.task_eval counts the successes)."""

from __future__ import annotations

from typing import Sequence


def pass_at_k(correct_per_prompt: Sequence[int]) -> float:
    """Fraction of prompts with at least one right answer."""
    if not correct_per_prompt:
        raise ValueError("pass@k of no prompts")
    return sum(c > 0 for c in correct_per_prompt) / len(correct_per_prompt)
