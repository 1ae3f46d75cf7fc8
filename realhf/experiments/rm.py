"""Reward-model training (`training/main_rm.py`) on the RL trainer's engine.

A reward model is a value head on the policy's architecture (the critic's: one output per
position, realhf.impl.model.model_loading.load_value_model); a prompt and answer score the
output at the answer's last token (its EOS). Or (`kind=implicit`) it is the causal LM itself,
and an answer scores beta * Σ over its tokens of log π - log π_ref, π_ref a frozen copy of the
starting model (realhf.impl.model.reward_card says why). Each optimizer step takes `batch_size` preference
pairs (a prompt, the `chosen` answer, the `rejected` one) and minimises the Bradley–Terry loss
−log σ(r_chosen − r_rejected), averaged over the pairs of all DP ranks. A pair's two rows stay
on one rank and in one forward (RMConfig has no micro_batch_tokens); the ranks, their launch and
their failure handling are SFT's (realhf.experiments.sft). The output is an HF directory
(AutoModelForTokenClassification, one label; or AutoModelForCausalLM) with its card
(`realhf_reward.json`: the kind, beta, the reference) that an RL run names as `reward.path` and
scores its rollouts with (the `reward_model` op of the step's graph, realhf.system.trainer.step_ops).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Sequence

import torch

from realhf.api.cli_args import RMConfig
from realhf.api.prompt import PromptRow
from realhf.api.train_batch import TrainBatch
from realhf.base import collectives
from realhf.base.device import all_reduce_sum
from realhf.experiments.sft import Log, rank_session, split_by_tokens
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_prompts
from realhf.impl.dataset.prompt_encoding import chat_template_on, encode_prompt
from realhf.impl.dataset.table_formats import DatasetFormatError
from realhf.impl.model.reward_card import RewardCard, read_card, write_card
from realhf.system.trainer.actor import implicit_scores, sequence_scores, token_logprobs


class Pair(NamedTuple):
    chosen: List[int]  # prompt + answer + EOS
    rejected: List[int]
    prompt_len: int  # tokens of the prompt both start with


def encode_pair(tokenizer: Any, row: PromptRow, chat: bool) -> Pair:
    """`row`'s two sequences, each its prompt as the rollouts encode it, the answer and EOS."""
    where = row.source or row.query_id
    answers = [row.fields.get(k) for k in ("chosen", "rejected")]
    if not all(isinstance(a, str) for a in answers):
        raise DatasetFormatError(f"{where}: a preference pair needs 'chosen' and 'rejected' answer texts")
    if answers[0] == answers[1]:
        raise DatasetFormatError(f"{where}: 'chosen' and 'rejected' are the same text (the pair teaches nothing)")
    # An empty answer stays: a policy that stops at once is a failure a reward model must score.
    prompt = encode_prompt(tokenizer, row.as_dict(), chat)
    eos = [tokenizer.eos_token_id]
    chosen, rejected = (prompt + tokenizer.encode(a, add_special_tokens=False) + eos for a in answers)
    return Pair(chosen, rejected, len(prompt))


def to_pair_batch(pairs: Sequence[Pair], pad_id: int) -> TrainBatch:
    """Rows 2i (chosen) and 2i+1 (rejected) of pair i, right-padded; group_ids the pair,
    loss_mask the answers' tokens (what an implicit reward sums over)."""
    seqs = [(s, p.prompt_len) for p in pairs for s in (p.chosen, p.rejected)]
    n, width = len(seqs), max([len(s) for s, _ in seqs] + [2])
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # [2P, T]
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # [2P, T]
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)  # [2P, T-1] column j: token j+1
    for i, (s, prompt_len) in enumerate(seqs):
        input_ids[i, : len(s)] = torch.tensor(s)
        attention_mask[i, : len(s)] = 1
        loss_mask[i, max(prompt_len - 1, 0) : len(s) - 1] = True
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=torch.zeros((n, width - 1)),  # unused: no policy here
        rewards=torch.zeros(n),  # unused
        group_ids=torch.arange(n) // 2,  # [2P] the pair
        prompt_lens=torch.tensor([p for _, p in seqs]),  # [2P]
    )


ScoreFn = Callable[[torch.Tensor, TrainBatch], torch.Tensor]  # (model output, micro-batch) -> [n]


def implicit_score_fn(beta: float) -> ScoreFn:
    """Scores of a causal LM's logits against the batch's `ref_logprobs` (the frozen reference's)."""
    return lambda logits, mb: implicit_scores(token_logprobs(logits, mb), mb.ref_logprobs, mb.loss_mask, beta)


class BradleyTerry:
    """The engine's loss over the pairs of a micro-batch (both rows of a pair in it), and the
    step's statistics: mean loss, accuracy (chosen scored higher), margin. `score_fn`: a value
    head's output at the last token (the default), or implicit_score_fn."""

    def __init__(self, score_fn: ScoreFn = sequence_scores):
        self.score_fn = score_fn
        self.sums = torch.zeros(4, dtype=torch.float64)  # loss, correct, margin, pairs

    def loss(self, output: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
        return self.bt_loss(self.score_fn(output, mb))

    def bt_loss(self, scores: torch.Tensor) -> torch.Tensor:
        """Σ over the pairs of −log σ(r_chosen − r_rejected), `scores` [2p] in pair order."""
        if scores.shape[0] % 2:
            raise ValueError(
                "a micro-batch split a preference pair (the reward model's engine takes micro_batch_tokens=0)"
            )
        margin = scores[0::2] - scores[1::2]  # [p]
        loss = -torch.nn.functional.logsigmoid(margin)  # [p]
        m = margin.detach().double().cpu()
        self.sums += torch.tensor([float(loss.detach().sum()), float((m > 0).sum()), float(m.sum()), len(m)])
        return loss.sum()

    @staticmethod
    def n_pairs(mb: TrainBatch) -> float:
        return mb.n_seqs / 2

    def step_stats(self) -> Dict[str, float]:
        """Collective: this step's numbers over all ranks; resets the sums."""
        sums = all_reduce_sum(self.sums.clone())
        self.sums = torch.zeros(4, dtype=torch.float64)
        n = max(float(sums[3]), 1.0)
        return {"loss": float(sums[0]) / n, "accuracy": float(sums[1]) / n, "margin": float(sums[2]) / n}


class ImplicitBradleyTerry(BradleyTerry):
    """Bradley–Terry on an implicit reward (implicit_score_fn), plus `nll_weight` times each chosen
    answer's per-token negative log-likelihood (DPO + NLL, Pang et al. 2024, "Iterative
    Reasoning Preference Optimization"). Without it the model pushes the rejected answers down
    faster than it lifts the chosen ones, and its mass goes elsewhere: the log-ratio then scores
    most answers below 0, so an RL run on it learns to stop early (docs/benchmarks.md)."""

    def __init__(self, beta: float, nll_weight: float = 0.0):
        super().__init__()
        self.beta, self.nll_weight = beta, nll_weight

    def loss(self, logits: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
        logprobs = token_logprobs(logits, mb)  # [2p, T-1]
        loss = self.bt_loss(implicit_scores(logprobs, mb.ref_logprobs, mb.loss_mask, self.beta))
        if self.nll_weight > 0:
            mask = mb.loss_mask[0::2].to(logprobs.dtype)  # [p, T-1] the chosen answers' tokens
            nll = -(logprobs[0::2] * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [p]
            loss = loss + self.nll_weight * nll.sum()
        return loss


def load_pairs(path: str, cfg: RMConfig, split: str, limit: int = 0) -> List[PromptRow]:
    rows = load_prompts(path, required=(), columns=cfg.dataset.columns, split=split)
    return rows[:limit] if limit > 0 else rows


def run_rank(cfg: RMConfig, rank: int = 0, world: int = 1, store_addr: str = "", log: Log = print) -> Dict[str, Any]:
    """Train rank `rank` of `world` and write output_path (rank 0); the report, complete on rank 0."""
    with rank_session(cfg, rank, world, store_addr) as session:
        tokenizer, pad_id, device = session.tokenizer, session.pad_id, session.device
        rows = load_pairs(cfg.train_path, cfg, cfg.dataset.split, cfg.max_train_rows)
        encoded = {r.query_id: encode_pair(tokenizer, r, session.chat) for r in rows}  # every row checked first
        # micro_batch_tokens is 0 (engine_config): a pair's two rows go through one forward.
        implicit = cfg.kind == "implicit"
        engine = session.open_engine(value_head=not implicit, name="rm")
        ref = session.open_engine(name="ref", trainable=False) if implicit else None
        log(
            f"RM ({cfg.kind}{f', beta {cfg.beta}, nll_weight {cfg.nll_weight}' if implicit else ''}): "
            f"{engine.n_params / 1e6:.2f}M parameters "
            f"({engine.n_trainable / 1e6:.3f}M trained), {len(rows)} preference pairs, {cfg.steps} steps x "
            f"{cfg.batch_size} pairs, DP={world} on {device}"
        )
        sampler = PromptSampler(rows, seed=cfg.seed)
        bt = ImplicitBradleyTerry(cfg.beta, cfg.nll_weight) if implicit else BradleyTerry()
        history: List[Dict[str, float]] = []
        start = time.perf_counter()
        for step in range(cfg.steps):
            pairs = [encoded[r.query_id] for r in sampler.next_batch(cfg.batch_size)]
            mine = split_by_tokens([len(p.chosen) + len(p.rejected) for p in pairs], world)[rank]
            batch = to_pair_batch([pairs[i] for i in mine], pad_id)
            try:
                if ref is not None:
                    batch.ref_logprobs = ref.forward(batch, lambda logits, mb: token_logprobs(logits, mb))  # [2p, T-1]
                out = engine.train_batch(batch, bt.loss, bt.n_pairs)
            except collectives.CollectiveTimeoutError as e:
                raise e.at(f"step {step + 1}", "collective_timeout") from None
            stats = {**bt.step_stats(), "lr": out["lr"], "grad_norm": out["grad_norm"]}
            history.append(stats)
            if (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.steps:
                log(
                    f"step {step + 1}/{cfg.steps} loss {stats['loss']:.4f} accuracy {stats['accuracy']:.3f} "
                    f"margin {stats['margin']:+.3f} lr {stats['lr']:.2e} {time.perf_counter() - start:.1f} s"
                )
        train_seconds = time.perf_counter() - start
        engine.save_hf(Path(cfg.output_path), tokenizer_source=cfg.model_path)
        if rank == 0:
            reference = os.path.abspath(cfg.model_path) if implicit else ""
            write_card(Path(cfg.output_path), RewardCard(cfg.kind, cfg.beta if implicit else 1.0, reference))
        collectives.barrier()
        return {"history": history, "train_seconds": train_seconds, "n_params": engine.n_params, "dp": world}


@torch.no_grad()
def pair_accuracy(model_path: str, rows: Sequence[PromptRow], cfg: RMConfig, batch_pairs: int = 64) -> Dict[str, float]:
    """How often the reward model at `model_path` (loaded as any user would: HF
    AutoModelForTokenClassification, or for an implicit one AutoModelForCausalLM beside its
    reference) scores the chosen answer above the rejected one."""
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

    card = read_card(model_path) or RewardCard("value_head")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if card.kind == "implicit":
        model = AutoModelForCausalLM.from_pretrained(model_path, use_safetensors=True).eval()
        ref = AutoModelForCausalLM.from_pretrained(card.reference, use_safetensors=True).eval()
    else:
        model = AutoModelForTokenClassification.from_pretrained(model_path, use_safetensors=True).eval()
    chat = chat_template_on(cfg.dataset.chat_template, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pairs = [encode_pair(tokenizer, r, chat) for r in rows]
    margins: List[float] = []
    for i in range(0, len(pairs), batch_pairs):
        batch = to_pair_batch(pairs[i : i + batch_pairs], pad_id)
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [2p, T, 1 or V]
        if card.kind == "implicit":
            ref_out = ref(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits  # [2p, T, V]
            batch.ref_logprobs = token_logprobs(ref_out, batch)
            scores = implicit_score_fn(card.beta)(out, batch)
        else:
            scores = sequence_scores(out, batch)
        margins += (scores[0::2] - scores[1::2]).tolist()
    n = max(len(margins), 1)
    return {"n": len(margins), "accuracy": sum(m > 0 for m in margins) / n, "margin": sum(margins) / n}


def train_rm(cfg: RMConfig, log: Log = print) -> Dict[str, Any]:
    """Validate, train (in this process at dp=1, else on `dp` rank processes), write output_path,
    then report the held-out pair accuracy (eval_n >= 0)."""
    from realhf.experiments.sft import launch_ranks
    from realhf.experiments.validation import ConfigError, check_rm

    try:
        check_rm(cfg)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    report = run_rank(cfg, log=log) if cfg.dp == 1 else launch_ranks(cfg, log, kind="rm")
    log(f"saved {cfg.output_path}")
    if cfg.eval_n >= 0:
        test = load_pairs(cfg.test_path, cfg, cfg.dataset.test_split, cfg.eval_n)
        res = pair_accuracy(cfg.output_path, test, cfg)
        report["test"] = res
        log(
            f"held-out pairs: the chosen answer scores higher in {res['accuracy']:.3f} of {res['n']} "
            f"(mean margin {res['margin']:+.3f})"
        )
    return report
