"""What scripts/make_tool_task.py and scripts/make_code_task.py share: their arguments, and the
pipeline data → random-init base model → supervised warm start (run as the documented
`training/main_sft.py` command, with its CLI keys). The task's own module gives the rows and the
tokenizer."""

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import transformers

from realhf.plugins.tasks.math_synthetic import write_jsonl
from realhf.plugins.tasks.tiny_model import build_model, save_model_dir

REPO = Path(__file__).resolve().parent.parent


def task_arguments(doc: str, argv=None, n_extra: Optional[Mapping[str, int]] = None) -> argparse.Namespace:
    """The shared arguments; `n_extra` adds `--n-<split>` (default: its value) per extra split."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="output directory")
    ap.add_argument("--n-train", type=int, default=10000)
    ap.add_argument("--n-test", type=int, default=500)
    for name, n in (n_extra or {}).items():
        ap.add_argument(f"--n-{name}", type=int, default=n, help=f"rows of the {name} split")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sft-steps", type=int, default=300, help="warm-start optimizer steps")
    ap.add_argument("--data-only", action="store_true", help="write only <out>/data (the model is in the repository)")
    args = ap.parse_args(argv)
    transformers.utils.logging.disable_progress_bar()
    return args


def build_task(
    args: argparse.Namespace,
    train_rows: Sequence[dict],
    test_rows: Sequence[dict],
    make_tokenizer: Callable[[], Any],
    *,
    extra_splits: Optional[Mapping[str, Sequence[dict]]] = None,
    model_kwargs: Optional[Mapping[str, int]] = None,
    sft_overrides: Sequence[str] = (),
) -> int:
    """Write <out>/data (train, test and `extra_splits`), then (unless --data-only) <out>/base
    (`build_model(**model_kwargs)`) and <out>/sft (`sft_overrides`: more main_sft.py keys); the
    exit code."""
    write_jsonl(args.out / "data" / "train.jsonl", train_rows)
    write_jsonl(args.out / "data" / "test.jsonl", test_rows)
    for name, rows in (extra_splits or {}).items():
        write_jsonl(args.out / "data" / f"{name}.jsonl", rows)
    rows = f"({len(train_rows)} + {len(test_rows)} rows)"
    if args.data_only:
        print(f"wrote {args.out}/data {rows}", flush=True)
        return 0
    tokenizer = make_tokenizer()
    save_model_dir(build_model(tokenizer, seed=args.seed, **(model_kwargs or {})), tokenizer, args.out / "base")
    print(f"wrote {args.out}/data {rows} and {args.out}/base", flush=True)
    sft = [
        sys.executable,
        str(REPO / "training" / "main_sft.py"),
        f"model_path={args.out / 'base'}",
        f"output_path={args.out / 'sft'}",
        f"train_path={args.out / 'data' / 'train.jsonl'}",
        f"test_path={args.out / 'data' / 'test.jsonl'}",
        f"steps={args.sft_steps}",
        "eval_n=-1",  # its report grades math answers; each task is evaluated through its own env
        f"seed={args.seed}",
        "log_interval=50",
        # The shipped warm starts were made with each step in one forward (SFT's default then).
        *(["micro_batch_tokens=0"] if not any(o.startswith("micro_batch_tokens=") for o in sft_overrides) else []),
        *sft_overrides,
    ]
    return subprocess.run(sft, cwd=REPO).returncode
