"""Supervised warm start: fine-tune a causal LM on prompt -> reference-solution pairs.

    python training/main_sft.py model_path=assets/tiny-math/base output_path=assets/tiny-math/sft \\
        train_path=assets/tiny-math/data/train.jsonl test_path=assets/tiny-math/data/test.jsonl

Every field of `realhf.api.cli_args.SFTConfig` can be overridden as `key=value`. The loss is
the token mean of the cross-entropy over completion tokens (and the EOS that ends them), never
over the prompt. The run stops at a fixed step count with fixed seeds, so the same command
always produces the same checkpoint, then reports greedy and sampled (T=1) accuracy on the
test split.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple, Union

import hydra
import torch
import transformers
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from realhf.api.cli_args import SFTConfig
from realhf.api.prompt import PromptRow
from realhf.experiments.config_keys import check_overrides
from realhf.experiments.validation import ConfigError, check_sft
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_jsonl_prompts
from realhf.impl.environment.math_grader import MathGrader
from realhf.impl.evaluation import evaluate_math_accuracy

# (token ids, loss): the number of prompt tokens (the loss is on everything after them), or a
# 0/1 loss mask per token (a multi-turn trace, whose tool turns carry no loss)
Example = Tuple[List[int], Union[int, List[int]]]


def encode_example(tokenizer: PreTrainedTokenizerBase, row: PromptRow) -> Example:
    if "sft_trace" in row.fields:
        return encode_trace(tokenizer, row)
    # Prompt and completion are encoded separately, as the RL sampler will see them: the
    # prompt's tokens followed by generated tokens.
    prompt = tokenizer.encode(row.prompt, add_special_tokens=False)
    completion = tokenizer.encode(row.solutions[0], add_special_tokens=False)
    return prompt + completion + [tokenizer.eos_token_id], len(prompt)


class _Replay:
    """A generation client that 'generates' the given assistant turn (and EOS)."""

    def __init__(self, ids: List[int]):
        self.ids = ids

    async def generate(self, qid, input_ids, gconfig, group_size=1):
        from realhf.system.generation_client import GenerationResult

        return GenerationResult(self.ids, [0.0] * len(self.ids), [0] * len(self.ids), "stop", 1)


def encode_trace(tokenizer: PreTrainedTokenizerBase, row: PromptRow) -> Example:
    """A row's `sft_trace` (assistant and tool turns) as the RL episode's tokens would be: built
    by the same generation handle (realhf.system.episode.Gen) through the chat template, so the
    warm start and the rollouts see identical token sequences. Tool turns carry no loss."""
    import asyncio

    from realhf.api.cli_args import GenerationHyperparameters
    from realhf.impl.dataset.prompt_encoding import encode_prompt
    from realhf.system.episode import Gen

    async def build() -> Example:
        gen = Gen(
            None,
            row.query_id,
            encode_prompt(tokenizer, row.as_dict(), chat=True),
            GenerationHyperparameters(),
            tokenizer,
        )
        for turn in row.fields["sft_trace"]:
            if turn["role"] == "assistant":
                gen._client = _Replay(
                    tokenizer.encode(turn["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
                )
                await gen()
            else:
                gen.append([turn])
        return gen.ids, [0] * len(gen.prompt_ids) + gen.loss_mask

    return asyncio.run(build())


def collate(examples: Sequence[Example], pad_id: int) -> Dict[str, torch.Tensor]:
    """Right-padded ids, attention mask, and a mask of the tokens the loss is taken on."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for i, (ids, loss) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        if isinstance(loss, int):
            loss_mask[i, loss : len(ids)] = True
        else:
            loss_mask[i, : len(ids)] = torch.tensor(loss, dtype=torch.bool)
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


def completion_loss(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # Position t predicts token t+1.
    targets = batch["input_ids"][:, 1:]
    mask = batch["loss_mask"][:, 1:]
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none"
    )
    return (nll * mask.reshape(-1)).sum() / mask.sum()


def warmup_cosine(warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear from 1/warmup to 1, then cosine down to 0 at `total_steps`."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


# Tokenizer files copied verbatim from the input model: fine-tuning does not change the tokenizer,
# and re-saving through transformers would rewrite them (e.g. tokenizer_class).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
)  # fmt: skip


def save_hf_dir(model, tokenizer, out: Path, tokenizer_source: Path) -> None:
    """Write the HF directory next to `out` and rename it into place, so a reader never sees a
    half-written checkpoint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; a checkpoint is meant to be shared
    model.save_pretrained(str(tmp), safe_serialization=True)
    copied = [f for f in TOKENIZER_FILES if (tokenizer_source / f).is_file()]
    for name in copied:
        shutil.copyfile(tokenizer_source / name, tmp / name)
    if "tokenizer.json" not in copied and "tokenizer_config.json" not in copied:
        tokenizer.save_pretrained(str(tmp))
    for f in tmp.iterdir():
        f.chmod(0o644)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def train_sft(cfg: SFTConfig, log: Callable[[str], None] = print) -> Dict[str, object]:
    """Run the warm start; returns the loss of every step, timings and the accuracies."""
    try:
        check_sft(cfg)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    torch.set_num_threads(cfg.n_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model_path, dtype=torch.float32)
    rows = load_jsonl_prompts(cfg.train_path)
    if cfg.max_train_rows > 0:
        rows = rows[: cfg.max_train_rows]
    examples = {r.query_id: encode_example(tokenizer, r) for r in rows}
    sampler = PromptSampler(rows, seed=cfg.seed)

    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.warmup_steps, cfg.steps))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"SFT: {n_params / 1e6:.2f}M parameters, {len(rows)} training rows, {cfg.steps} steps x {cfg.batch_size}")

    losses: List[float] = []
    n_tokens = 0
    model.train()
    start = time.perf_counter()
    for step in range(cfg.steps):
        batch = collate([examples[r.query_id] for r in sampler.next_batch(cfg.batch_size)], tokenizer.pad_token_id)
        loss = completion_loss(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        n_tokens += int(batch["attention_mask"].sum())
        if (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.steps:
            elapsed = time.perf_counter() - start
            log(
                f"step {step + 1}/{cfg.steps} loss {losses[-1]:.4f} lr {schedule.get_last_lr()[0]:.2e} "
                f"epoch {sampler.epoch} {n_tokens / elapsed:.0f} tok/s {elapsed:.1f} s"
            )
    train_seconds = time.perf_counter() - start

    out = Path(cfg.output_path)
    save_hf_dir(model, tokenizer, out, tokenizer_source=Path(cfg.model_path))
    log(f"saved {out}")
    report: Dict[str, object] = {"losses": losses, "train_seconds": train_seconds}
    if cfg.eval_n >= 0:
        test = load_jsonl_prompts(cfg.test_path)
        test = test[: cfg.eval_n] if cfg.eval_n > 0 else test
        with MathGrader(n_workers=1) as grader:
            for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
                res = evaluate_math_accuracy(
                    out, test, temperature=temperature, n=1, max_new_tokens=cfg.max_new_tokens,
                    batch_size=cfg.eval_batch_size, grader=grader, seed=cfg.seed,
                )  # fmt: skip
                report[name] = res["accuracy"]
                log(f"{name} (T={temperature:g}) accuracy on {res['n']} test prompts: {res['accuracy']:.3f}")
    return report


# ---- Hydra entry point ----------------------------------------------------------------------

ConfigStore.instance().store(name="sft_schema", node=SFTConfig)
# The primary config: the schema plus Hydra settings that keep the app from creating outputs/
# directories and from replacing the logging configuration.
ConfigStore.instance().store(
    name="sft",
    node={
        "defaults": [
            "sft_schema",
            "_self_",
            {"override hydra/job_logging": "disabled"},
            {"override hydra/hydra_logging": "disabled"},
        ],
        "hydra": {"run": {"dir": "."}, "output_subdir": None},
    },
)


@hydra.main(version_base=None, config_name="sft")
def main(cfg) -> None:
    sft_cfg: SFTConfig = OmegaConf.to_object(cfg)
    transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint load is noise
    report = train_sft(sft_cfg, log=lambda msg: print(msg, flush=True))
    summary = {k: v for k, v in report.items() if k != "losses"}
    summary["final_loss"] = report["losses"][-1]
    print("SFT result: " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    # Hydra's answer to a misspelt key is to prepend '+' (which fails too): name the key meant.
    unknown = check_overrides(sys.argv[1:], SFTConfig)
    if unknown is not None:
        print(f"config error: {unknown}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
