"""Write the synthetic arithmetic dataset as train.jsonl and test.jsonl.

    python scripts/make_math_dataset.py --out assets/tiny-math/data --n-train 10000 --n-test 500 --seed 1
    python scripts/make_math_dataset.py --out assets/smollm2-math/data --chat   # chat rows for an instruct model

The output is a pure function of the arguments (see realhf.plugins.tasks.math_synthetic).
"""

import argparse
import sys
from pathlib import Path

from realhf.plugins.tasks.math_synthetic import GeneratorConfig, generate_splits, to_rows, write_jsonl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--n-train", type=int, default=10000, help="number of training problems")
    ap.add_argument("--n-test", type=int, default=500, help="number of held-out problems")
    ap.add_argument("--seed", type=int, default=1, help="random seed")
    ap.add_argument("--digits", type=int, default=1, help="digits per operand (1: 1..9)")
    ap.add_argument("--max-operand", type=int, default=0, help="largest operand; 0: largest with --digits")
    ap.add_argument("--steps", type=int, default=2, help="maximum number of add/subtract operations")
    ap.add_argument(
        "--chat",
        action="store_true",
        help="rows as one chat user message (the story and --instruction) for an instruct model",
    )
    ap.add_argument(
        "--instruction",
        default="Give only the final number as your answer.",
        help="with --chat: the sentence after the story",
    )
    args = ap.parse_args(argv)

    cfg = GeneratorConfig(digits=args.digits, max_operand=args.max_operand, steps=args.steps)
    try:
        train, test = generate_splits(args.n_train, args.n_test, args.seed, cfg)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    instruction = args.instruction if args.chat else None
    write_jsonl(args.out / "train.jsonl", to_rows(train, "train", instruction))
    write_jsonl(args.out / "test.jsonl", to_rows(test, "test", instruction))
    print(f"wrote {len(train)} train and {len(test)} test problems to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
