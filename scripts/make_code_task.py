"""Build the embedded code task: data, a tokenizer covering its code, a random model, and its
supervised warm start.

    python scripts/make_code_task.py --out assets/tiny-code [--sft-steps 300] [--data-only]

Writes <out>/data/{train,test}.jsonl (realhf.plugins.tasks.code_task: three calls of a hidden
function, the answer its body, four hidden test calls), <out>/base (random-init model + tokenizer)
and <out>/sft (after `training/main_sft.py` on the reference bodies, run as a command with its
CLI keys). Everything is seeded. The accuracy of the warm start is measured through the task
(the code environment), not by main_sft.py, whose report grades math answers: see
scripts/bench/code_task.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file or as scripts.make_code_task

from realhf.plugins.tasks.code_task import generate_splits, to_rows, vocabulary  # noqa: E402
from realhf.plugins.tasks.tiny_model import build_tokenizer  # noqa: E402
from scripts.tiny_task_assets import build_task, task_arguments  # noqa: E402


def main(argv=None) -> int:
    args = task_arguments(__doc__, argv)
    train, test = generate_splits(args.n_train, args.n_test, args.seed)
    return build_task(args, to_rows(train, "train"), to_rows(test, "test"), lambda: build_tokenizer(vocabulary()))


if __name__ == "__main__":
    sys.exit(main())
