"""Preference pairs for the embedded math task, from the SFT model's own answers: for each prompt,
`--samples` answers sampled at T = 1 by the built-in engine and graded by the task's grader; a
prompt with a right and a wrong answer gives one pair (chosen: a right one, rejected: a wrong one,
both drawn at random). What training/main_rm.py trains a reward model on.

    python -m scripts.make_preference_pairs                       # -> assets/tiny-math/prefs/{train,test}.jsonl
    python -m scripts.make_preference_pairs --n-train 2000 --n-test 300 --samples 8

Rows: {query_id, prompt, chosen, rejected, solutions}. Deterministic for a seed. Prints how many
prompts gave a pair (a prompt the model always or never solves gives none).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from realhf.impl.dataset.prompt_dataset import load_prompts
from realhf.plugins.environments.math_grader import MathGrader
from realhf.plugins.tasks.math_accuracy import engine_generate_fn, evaluate_math_accuracy

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "assets" / "tiny-math"


def pairs_of(model: str, rows, samples: int, seed: int, max_new_tokens: int, threads: int, per_prompt: int = 1):
    gen = engine_generate_fn(model, threads=threads, seed=seed)
    with MathGrader(n_workers=1) as grader:
        res = evaluate_math_accuracy(
            model, rows, temperature=1.0, n=samples, max_new_tokens=max_new_tokens,
            generate_fn=gen, grader=grader, seed=seed, keep_answers=True,
        )  # fmt: skip
    rng = random.Random(seed)
    out = []
    for row, answers in zip(rows, res["answers"]):
        right = sorted({t for t, ok in answers if ok})
        wrong = sorted({t for t, ok in answers if not ok})
        if not (right and wrong):
            continue
        # One pair draws as the shipped set was drawn (it reproduces); more draw distinct combinations.
        if per_prompt == 1:
            chosen_rejected = [(rng.choice(right), rng.choice(wrong))]
        else:
            combos = [(c, r) for c in right for r in wrong]
            chosen_rejected = rng.sample(combos, min(per_prompt, len(combos)))
        for k, (chosen, rejected) in enumerate(chosen_rejected):
            out.append(
                {
                    "query_id": row.query_id if per_prompt == 1 else f"{row.query_id}-{k}",
                    "prompt": row.prompt,
                    "chosen": chosen,
                    "rejected": rejected,
                    "solutions": list(row.solutions),
                }
            )
    return out, res["accuracy"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.make_preference_pairs", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(TASK / "sft"))
    p.add_argument("--train", default=str(TASK / "data" / "train.jsonl"))
    p.add_argument("--test", default=str(TASK / "data" / "test.jsonl"))
    p.add_argument("--out", default=str(TASK / "prefs"))
    p.add_argument("--n-train", type=int, default=2000, help="training prompts to sample (the first N)")
    p.add_argument("--n-test", type=int, default=300, help="held-out prompts to sample (the first N)")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--pairs-per-prompt", type=int, default=1,
        help="pairs a prompt gives at most (distinct right x wrong answers, drawn at random)",
    )  # fmt: skip
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, path, n in (("train", args.train, args.n_train), ("test", args.test, args.n_test)):
        rows = load_prompts(path)[:n]
        pairs, acc = pairs_of(
            args.model, rows, args.samples, args.seed, args.max_new_tokens, args.threads, args.pairs_per_prompt
        )
        with open(out / f"{name}.jsonl", "w") as f:
            for pair in pairs:
                f.write(json.dumps(pair) + "\n")
        print(f"{name}: {len(pairs)} pairs from {len(rows)} prompts (sampled accuracy {acc:.3f}) -> {out / name}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
