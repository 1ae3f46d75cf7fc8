"""Build the embedded code task: data, a tokenizer covering its code, a random model, and its
supervised warm start.

    python scripts/make_code_task.py --out assets/tiny-code [--sft-steps 300] [--data-only]

Writes <out>/data/{train,test}.jsonl (realhf.impl.dataset.code_task: three calls of a hidden
function, the answer its body, four hidden test calls), <out>/base (random-init model + tokenizer)
and <out>/sft (after `training/main_sft.py` on the reference bodies, run as a command with its
CLI keys). Everything is seeded. The accuracy of the warm start is measured through the task
(the code environment), not by main_sft.py, whose report grades math answers: see
scripts/bench/code_task.py.
"""

import argparse
import subprocess
import sys
from pathlib import Path

import transformers

from realhf.impl.dataset.code_task import generate_splits, to_rows, vocabulary
from realhf.impl.dataset.math_synthetic import write_jsonl
from realhf.impl.dataset.tiny_model import build_model, build_tokenizer, save_model_dir

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--n-train", type=int, default=10000)
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sft-steps", type=int, default=300, help="warm-start optimizer steps")
    ap.add_argument("--data-only", action="store_true", help="write only <out>/data (the model is in the repository)")
    args = ap.parse_args(argv)
    transformers.utils.logging.disable_progress_bar()

    train, test = generate_splits(args.n_train, args.n_test, args.seed)
    write_jsonl(args.out / "data" / "train.jsonl", to_rows(train, "train"))
    write_jsonl(args.out / "data" / "test.jsonl", to_rows(test, "test"))
    if args.data_only:
        print(f"wrote {args.out}/data ({len(train)} + {len(test)} rows)", flush=True)
        return 0

    tokenizer = build_tokenizer(vocabulary())
    save_model_dir(build_model(tokenizer, seed=args.seed), tokenizer, args.out / "base")
    print(f"wrote {args.out}/data ({len(train)} + {len(test)} rows) and {args.out}/base", flush=True)

    sft = [
        sys.executable,
        str(REPO / "training" / "main_sft.py"),
        f"model_path={args.out / 'base'}",
        f"output_path={args.out / 'sft'}",
        f"train_path={args.out / 'data' / 'train.jsonl'}",
        f"test_path={args.out / 'data' / 'test.jsonl'}",
        f"steps={args.sft_steps}",
        "eval_n=-1",  # its report grades math answers; the task's own evaluation is the code env's
        f"seed={args.seed}",
        "log_interval=50",
    ]
    return subprocess.run(sft, cwd=REPO).returncode


if __name__ == "__main__":
    sys.exit(main())
