"""The long-reasoning task's warm start (or any checkpoint): how long its answers are at T=1, and
how often they are right, by problem length.

    python -m scripts.bench.long_task [--model assets/tiny-long/sft] [--samples 8] [--short]

On the held-out `test` split (the training distribution) and the `longer` split (more packs than
any training problem): `--samples` answers per prompt at T=1 (pure sampling) and one greedy, all
through the native engine in this process, up to 768 new tokens. An answer's length counts its
tokens with the EOS that ends it. Graded as training grades (`rollout.env.check_work`: the right
total, every worked line right) and, beside it, on the final answer alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Sequence

from scripts.bench.common import REPO, emit, log, print_tables

MODEL = os.path.join(REPO, "assets", "tiny-long", "sft")
DATA = os.path.join(REPO, "assets", "tiny-long", "data")
MAX_NEW_TOKENS = 768
# Problem lengths (packs, i.e. worked lines) grouped as the task draws them, log-uniformly.
BUCKETS = ((1, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 40), (41, 52))


def ensure_data(data_dir: str = DATA) -> None:
    if not os.path.isfile(os.path.join(data_dir, "longer.jsonl")):
        import subprocess

        out = os.path.dirname(data_dir)
        cmd = [sys.executable, "scripts/make_long_math_task.py", "--out", out, "--data-only"]
        subprocess.run(cmd, cwd=REPO, check=True, timeout=600)


def percentile(xs: Sequence[int], q: float) -> int:
    """The nearest-rank percentile (a value that occurs)."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))]


def length_stats(lengths: Sequence[int]) -> Dict[str, float]:
    p50 = percentile(lengths, 50)
    return {
        "n": len(lengths),
        "mean": round(sum(lengths) / len(lengths), 1),
        "p50": p50,
        "p90": percentile(lengths, 90),
        "p99": percentile(lengths, 99),
        "max": max(lengths),
        "p99_over_p50": round(percentile(lengths, 99) / p50, 2),
    }


def measure(model: str, split: str, n_prompts: int, samples: int, temperature: float, threads: int) -> Dict:
    """Lengths and accuracy (overall and per bucket of `count`) of one split at one temperature."""
    import torch
    from transformers import AutoTokenizer

    from realhf.plugins.environments.math_answer import extract_answer, numbers_equal, work_lines_correct
    from realhf.plugins.tasks.math_accuracy import engine_generate_fn

    rows = [json.loads(line) for line in open(os.path.join(DATA, f"{split}.jsonl")) if line.strip()][:n_prompts]
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(r["prompt"]).input_ids for r in rows for _ in range(samples)]
    torch.manual_seed(1)
    t0 = time.perf_counter()
    outs = engine_generate_fn(model, slots=256, threads=threads)(prompts, temperature, MAX_NEW_TOKENS)
    gen_s = time.perf_counter() - t0
    lengths, success, answer_right, cut = [], [], [], 0
    for k, out in enumerate(outs):
        row = rows[k // samples]
        ids = out[: out.index(tok.eos_token_id) + 1] if tok.eos_token_id in out else out
        cut += tok.eos_token_id not in out
        lengths.append(len(ids))
        text = tok.decode(ids, skip_special_tokens=True)
        pred, ref = extract_answer(text), extract_answer(row["solutions"][0])
        right = pred is not None and bool(numbers_equal(pred, ref))
        answer_right.append(right)
        success.append(right and work_lines_correct(text))
    by_bucket = []
    for lo, hi in BUCKETS:
        idx = [k for k in range(len(outs)) if lo <= rows[k // samples]["count"] <= hi]
        if idx:
            by_bucket.append(
                {
                    "packs": f"{lo}-{hi}",
                    "n": len(idx),
                    "success": round(sum(success[k] for k in idx) / len(idx), 4),
                    "answer_right": round(sum(answer_right[k] for k in idx) / len(idx), 4),
                    "mean_tokens": round(sum(lengths[k] for k in idx) / len(idx), 1),
                }
            )
    log(f"{split} T={temperature}: success {sum(success) / len(success):.3f} in {gen_s:.0f} s")
    return {
        "split": split,
        "temperature": temperature,
        "samples_per_prompt": samples,
        "n_prompts": len(rows),
        "success": round(sum(success) / len(success), 4),
        "answer_right": round(sum(answer_right) / len(answer_right), 4),
        "truncated": round(cut / len(outs), 4),
        "lengths": length_stats(lengths),
        "by_packs": by_bucket,
        "generated_tokens": sum(lengths),
        "generate_s": round(gen_s, 1),
    }


def tables(r: Dict):
    lens = [
        [m["split"], f"T={m['temperature']}", m["lengths"]["n"]]
        + [m["lengths"][k] for k in ("mean", "p50", "p90", "p99", "max", "p99_over_p50")]
        + [m["truncated"]]
        for m in r["measurements"]
    ]
    acc: List[List] = []
    for m in r["measurements"]:
        for b in m["by_packs"]:
            acc.append(
                [
                    m["split"],
                    f"T={m['temperature']}",
                    b["packs"],
                    b["n"],
                    b["mean_tokens"],
                    b["success"],
                    b["answer_right"],
                ]
            )
        acc.append(
            [
                m["split"],
                f"T={m['temperature']}",
                "all",
                m["lengths"]["n"],
                m["lengths"]["mean"],
                m["success"],
                m["answer_right"],
            ]
        )
    return [
        (
            f"answer lengths in tokens (EOS included) of {r['model']}, {r['samples']} samples per prompt at T=1, one greedy",
            ["split", "sampling", "answers", "mean", "p50", "p90", "p99", "max", "p99/p50", "cut off at 768"],
            lens,
        ),
        (
            "accuracy by problem length (packs = worked lines): success = right total and every line right; answer = right total",
            ["split", "sampling", "packs", "answers", "mean tokens", "success", "answer right"],
            acc,
        ),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench.long_task", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=MODEL)
    p.add_argument("--samples", type=int, default=8, help="answers per prompt at T=1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--short", action="store_true", help="50 prompts per split, 2 samples")
    args = p.parse_args(argv)
    ensure_data()
    n, samples = (50, 2) if args.short else (10**9, args.samples)
    ms = []
    for split in ("test", "longer"):
        ms.append(measure(args.model, split, n, samples, 1.0, args.threads))
        ms.append(measure(args.model, split, n, 1, 0.0, args.threads))
    res = {
        "bench": "long_task",
        "model": os.path.relpath(args.model, REPO),
        "samples": samples,
        "max_new_tokens": MAX_NEW_TOKENS,
        "measurements": ms,
    }
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
