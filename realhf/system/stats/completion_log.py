"""A few of a step's samples as text, for a person watching the run (`stats.log_completions`).

DP rank 0 picks N samples of the groups it took for the step (`pick`: one per prompt first),
decodes them with the actor's tokenizer and sends the rows back in its `fetch` reply
(`completion_rows`): a few strings travel instead of the batch's token ids, and only one rank
loads a tokenizer. The master prints them under the step's line (`console_lines`) and appends
them, with the step, to `completions.jsonl` (realhf.base.trial_files.completions_path).

A row (plain msgpack/JSON values):

    {qid, reward, no_eos, version_start, version_end, n_prompt_tokens, n_output_tokens,
     metrics, prompt, completion}

`version_*` are the oldest and newest weight versions behind the sample's trained tokens;
`metrics` the agent's numbers for the sample (Outcome.info); `prompt` and `completion` the
decoded `prompt_ids` and `output_ids`, special tokens left out (as the agent's grader saw the
answer), whole — only the console line is cut.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Sequence, Tuple

from realhf.api.trajectory import Trajectory

# Characters of each text on the console line (the middle elided): the end of a prompt holds
# the question, the end of a completion its answer, so both ends are kept.
PROMPT_CHARS = 100
COMPLETION_CHARS = 160
METRICS_SHOWN = 4  # the agent's numbers on the console line; completions.jsonl has them all


def pick(groups: Sequence[Trajectory], n: int) -> List[Tuple[int, int]]:
    """(group index, sample index) of `n` samples spread over as many prompts as there are: the
    first sample of every group in turn, then the second, and so on; fewer when the groups hold
    fewer. (Samples of one group are drawn alike, so the first is as typical as any.)"""
    picked: List[Tuple[int, int]] = []
    depth = 0
    while len(picked) < n:
        round_ = [(gi, depth) for gi, g in enumerate(groups) if depth < len(g.samples)]
        if not round_:
            break
        picked += round_[: n - len(picked)]
        depth += 1
    return picked


def completion_rows(
    groups: Sequence[Trajectory], n: int, decode: Callable[[Sequence[int]], str]
) -> List[Dict[str, Any]]:
    """The rows of `n` picked samples of `groups`; `decode(token_ids) -> text` is the tokenizer's."""
    rows = []
    prompts: Dict[int, str] = {}  # a group's prompt is decoded once, however many of its samples show
    for gi, si in pick(groups, n):
        g, s = groups[gi], groups[gi].samples[si]
        if gi not in prompts:
            prompts[gi] = decode(g.prompt_ids.tolist())
        trained = s.versions[s.loss_mask != 0]
        versions = trained if trained.size else s.versions  # a sample with no trained token: all of it
        rows.append(
            {
                "qid": g.qid,
                "reward": float(s.reward),
                "no_eos": bool(s.no_eos),
                "version_start": int(versions.min()) if versions.size else 0,
                "version_end": int(versions.max()) if versions.size else 0,
                "n_prompt_tokens": int(len(g.prompt_ids)),
                "n_output_tokens": int(len(s.output_ids)),
                "metrics": {k: float(v) for k, v in s.metrics.items()},
                "prompt": prompts[gi],
                "completion": decode(s.output_ids.tolist()),
            }
        )
    return rows


def shorten(text: str, width: int) -> str:
    """`text` in at most `width` characters, its middle replaced by ' … ' when longer."""
    if len(text) <= width:
        return text
    keep = max(width - 3, 2)
    head = keep // 2
    return f"{text[:head]} … {text[len(text) - (keep - head) :]}"


def _quoted(text: str, width: int) -> str:
    # JSON quoting: newlines and control characters become visible escapes, so a row stays one line.
    return json.dumps(shorten(text, width), ensure_ascii=False)


def console_lines(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """One indented line per row, to print under the step's metrics line."""
    lines = []
    for i, r in enumerate(rows, 1):
        lo, hi = r["version_start"], r["version_end"]
        parts = [
            f"  completion {i}/{len(rows)}",
            f"qid {r['qid']}",
            f"v{lo}" if lo == hi else f"v{lo}-{hi}",
            f"reward {r['reward']:+.3f}" + (" (cut at max_new_tokens)" if r["no_eos"] else ""),
        ]
        metrics = list(r.get("metrics", {}).items())
        if metrics:
            shown = " ".join(f"{k}={v:g}" for k, v in metrics[:METRICS_SHOWN])
            parts.append(shown + (f" (+{len(metrics) - METRICS_SHOWN})" if len(metrics) > METRICS_SHOWN else ""))
        parts.append(f"prompt {_quoted(r['prompt'], PROMPT_CHARS)}")
        parts.append(f"completion {_quoted(r['completion'], COMPLETION_CHARS)}")
        lines.append(" | ".join(parts))
    return lines
