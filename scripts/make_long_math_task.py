"""Build the embedded long-reasoning task: data, a tokenizer for its words, a random model with
room for 1024-token sequences, and its supervised warm start.

    python scripts/make_long_math_task.py --out assets/tiny-long [--sft-steps 300] [--data-only]

Writes <out>/data/{train,test,longer}.jsonl (realhf.plugins.tasks.long_math: `count` packs of
`size` items added up one line per pack; train and test draw `count` log-uniformly from 1..40,
`longer` from 41..52, longer than any training problem), <out>/base (the tiny-math architecture,
2 layers, hidden 128, with max_position_embeddings 1024) and <out>/sft (after
`training/main_sft.py` on the reference solutions, run as a command with its CLI keys).
Everything is seeded. assets/tiny-long/README.md has the warm start's lengths and accuracy.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a file or as scripts.make_long_math_task

from realhf.plugins.tasks.long_math import generate_splits, to_rows, vocabulary  # noqa: E402
from realhf.plugins.tasks.tiny_model import build_tokenizer  # noqa: E402
from scripts.tiny_task_assets import build_task, task_arguments  # noqa: E402

# The longest sequence the task is run at: a prompt of at most 25 tokens and answers of up to
# 768 new tokens (the `longer` split's reach 702).
MAX_POSITIONS = 1024


def main(argv=None) -> int:
    args = task_arguments(__doc__, argv, n_extra={"longer": 200})
    splits = generate_splits(args.n_train, args.n_test, args.n_longer, args.seed)
    return build_task(
        args,
        to_rows(splits["train"], "train"),
        to_rows(splits["test"], "test"),
        lambda: build_tokenizer(vocabulary(), model_max_length=MAX_POSITIONS),
        extra_splits={"longer": to_rows(splits["longer"], "longer")},
        model_kwargs={"max_positions": MAX_POSITIONS},
        # Answers up to 534 tokens: rows go in order of length into forwards of at most 4096
        # padded tokens (the update is the same; one whole batch padded to its longest row
        # took 5x the time).
        sft_overrides=["micro_batch_tokens=4096"],
    )


if __name__ == "__main__":
    sys.exit(main())
