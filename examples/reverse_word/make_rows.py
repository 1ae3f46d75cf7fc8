"""Rows for reverse.py: words of 3-6 letters taken from a model's tokenizer vocabulary (tokens that
start a word: mostly whole words the model knows, some word stems), asked in chat format.

    python make_rows.py                                  # SmolLM2's vocabulary -> train.jsonl, test.jsonl
    python make_rows.py --model /path/to/hf_model --n-train 2000 --n-test 200 --out .
"""

import argparse
import json
import random
from pathlib import Path


def words_of(model: str, rng: random.Random) -> list:
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(model).get_vocab()
    # GPT-2 style byte-level BPE marks a leading space with "Ġ": such tokens start a word.
    words = sorted({t[1:].lower() for t in vocab if t.startswith("Ġ") and t[1:].isalpha() and 3 <= len(t) - 1 <= 6})
    rng.shuffle(words)
    return words


def row(i: int, split: str, word: str) -> dict:
    ask = f"Reverse the letters of the word '{word}'. Answer with the reversed word only."
    return {"query_id": f"{split}-{i:05d}", "messages": [{"role": "user", "content": ask}], "word": word}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="an HF model directory, or the built-in name")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    from realhf.experiments.file_validation import builtin_model_path

    words = words_of(builtin_model_path("--model", args.model), random.Random(args.seed))
    if len(words) < args.n_train + args.n_test:
        raise SystemExit(f"the vocabulary has {len(words)} words of 3-6 letters; ask for fewer rows")
    args.out.mkdir(parents=True, exist_ok=True)
    splits = {"test": words[: args.n_test], "train": words[args.n_test : args.n_test + args.n_train]}
    for split, chosen in splits.items():
        with open(args.out / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row(i, split, w)) + "\n" for i, w in enumerate(chosen))
        print(f"{args.out / f'{split}.jsonl'}: {len(chosen)} words")


if __name__ == "__main__":
    main()
