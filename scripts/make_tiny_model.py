"""Build the tiny task's word-level tokenizer and a random-init Qwen2 model as one HF directory.

    python scripts/make_tiny_model.py --out assets/tiny-math/base --seed 1

The tokenizer's words come from the dataset generator (realhf.plugins.tasks.math_synthetic), so
every dataset text encodes without `<unk>` and decodes back exactly.
"""

import argparse
import sys
from pathlib import Path

import transformers

from realhf.plugins.tasks.math_synthetic import vocabulary
from realhf.plugins.tasks.tiny_model import build_model, build_tokenizer, save_model_dir


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output HF directory")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random initialisation")
    args = ap.parse_args(argv)
    transformers.utils.logging.disable_progress_bar()

    tokenizer = build_tokenizer(vocabulary())
    model = build_model(tokenizer, seed=args.seed)
    save_model_dir(model, tokenizer, args.out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: vocab {len(tokenizer)}, {n_params / 1e6:.2f}M parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
