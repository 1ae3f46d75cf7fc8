"""Build the embedded tool-using task: data, a tokenizer with the tiny chat template, a random
model, and its supervised warm start on calculator traces.

    python scripts/make_tool_task.py --out assets/tiny-tools [--sft-steps 300] [--data-only]

Writes <out>/data/{train,test}.jsonl (the tiny-math problems, each with the `sft_trace` of a
calculator call), <out>/base (random-init model + tokenizer with `TOOL_CHAT_TEMPLATE`) and
<out>/sft (after `training/main_sft.py` on the traces). Everything is seeded; see
realhf.plugins.tasks.tool_task for the episode format.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file or as scripts.make_tool_task

from realhf.plugins.tasks.math_synthetic import generate_splits  # noqa: E402
from realhf.plugins.tasks.tiny_model import build_tokenizer  # noqa: E402
from realhf.plugins.tasks.tool_task import TOOL_CHAT_TEMPLATE, tool_rows, tool_vocabulary  # noqa: E402
from scripts.tiny_task_assets import build_task, task_arguments  # noqa: E402


def _tokenizer():
    tokenizer = build_tokenizer(tool_vocabulary())
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    return tokenizer


def main(argv=None) -> int:
    args = task_arguments(__doc__, argv)
    train, test = generate_splits(args.n_train, args.n_test, args.seed)
    return build_task(args, tool_rows(train, "train"), tool_rows(test, "test"), _tokenizer)


if __name__ == "__main__":
    sys.exit(main())
