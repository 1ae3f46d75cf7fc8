"""Supervised fine-tuning (the warm start before RL) on the RL trainer's own machinery: the logic of
`training/main_sft.py`.

The model trains through the TrainEngine the RL actor uses (realhf.impl.engine.fsdp_engine: FSDP2
over the DP ranks, gloo on CPUs and NCCL on GPUs, LoRA by peft) on rows read by the RL data loader
(realhf.impl.dataset.prompt_dataset.load_prompts: JSONL, parquet, `datasets` directories,
`dataset.columns`), prompts encoded as the rollouts encode them (`dataset.chat_template`). What a
row trains on — only these tokens carry the loss, never the prompt:

    sft_trace            its assistant turns and the EOS ending each; the tokens are the episode
                         the rollouts' own generation handle builds (realhf.system.rollout.episode.Gen,
                         the assistant turns replayed as if generated): tool turns carry no loss
    messages             the assistant turns of the chat, the same way: the messages before the
                         first assistant turn are the prompt, later user or tool turns are
                         appended as an episode appends them
    prompt + solutions   solutions[0] and EOS after the prompt

A step's loss is the token mean of the cross-entropy over the trained tokens of the whole batch.
With `dp` > 1, `train_sft` starts the ranks as processes (`python -m realhf.apps.sft_rank`, which
runs `run_rank`), each takes its share of every batch (Karmarkar–Karp over the examples' token
counts, realhf.system.master.dp_balance) and the engine divides each rank's loss sum by the global token
count, so a step is DP=1's step on the whole batch to float rounding. A rank that fails ends the
others and its error is the run's; Ctrl-C ends them all; `collective_timeout` bounds every
collective. `dp=1` trains in the calling process.

The output is a plain HF directory (with LoRA, the adapters merged into the base), so an RL run
starts from it with `actor.path=<output_path>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from realhf.api.cli_args import (
    EngineRunConfig,
    GenerationHyperparameters,
    ModelTrainEvalConfig,
    OptimizerConfig,
    SFTConfig,
)
from realhf.api.prompt import PromptRow
from realhf.api.train_batch import TrainBatch
from realhf.base import collectives
from realhf.base.device import bind_device, dist_backend, pick_device
from realhf.base.network import bind_gloo_to
from realhf.base.process import die_with_parent, kill_process_trees
from realhf.impl.dataset.prompt_dataset import PromptSampler, load_prompts
from realhf.impl.dataset.prompt_encoding import chat_template_on, encode_prompt
from realhf.impl.dataset.table_formats import DatasetFormatError
from realhf.impl.engine.fsdp_engine import FSDPEngine, FSDPEngineConfig
from realhf.plugins.environments.math_grader import MathGrader
from realhf.plugins.tasks.math_accuracy import evaluate_math_accuracy
from realhf.system.master.dp_balance import karmarkar_karp

Log = Callable[[str], None]
# (token ids, loss): the number of prompt tokens (the loss is on everything after them), or a 0/1
# loss flag per token (a multi-turn episode, whose non-assistant turns carry no loss)
Example = Tuple[List[int], Union[int, List[int]]]

RANK_COMMAND = ["-m", "realhf.apps.sft_rank"]
_HOST = "127.0.0.1"  # the ranks of one command meet on loopback


class SFTRankError(RuntimeError):
    """A DP rank of the command failed (the message is its error, `traceback` where it was
    raised); the others were stopped."""

    def __init__(self, message: str, traceback: str = ""):
        super().__init__(message)
        self.traceback = traceback


# ---- rows → token ids ---------------------------------------------------------------------------


def target_of(row: PromptRow) -> str:
    """What `row` trains on: 'sft_trace', 'messages' (its assistant turns) or 'solutions'; a
    row with none of them is refused, naming it."""
    where = row.source or row.query_id
    trace = row.fields.get("sft_trace")
    if trace is not None:
        if not isinstance(trace, list) or not all(
            isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in trace
        ):
            raise DatasetFormatError(f"{where}: sft_trace must be a list of {{role, content}} turns")
        if not any(t["role"] == "assistant" for t in trace):
            raise DatasetFormatError(f"{where}: sft_trace has no assistant turn to train on")
        return "sft_trace"
    messages = row.fields.get("messages") or []
    if any(m["role"] == "assistant" for m in messages):
        if messages[0]["role"] == "assistant":
            raise DatasetFormatError(
                f"{where}: the chat messages begin with an assistant turn; the messages before the "
                "first assistant turn are its prompt"
            )
        return "messages"
    if row.solutions:
        return "solutions"
    raise DatasetFormatError(
        f"{where}: nothing to train on: a row needs solutions (the completion of its prompt), assistant "
        "turns in its chat messages, or an sft_trace"
    )


def encode_example(tokenizer: Any, row: PromptRow, chat: bool) -> Example:
    """`row`'s tokens and where its loss is (see the module docstring); `chat`: whether prompt
    texts go through the chat template (`chat_template_on(dataset.chat_template, tokenizer)`)."""
    kind = target_of(row)
    if kind == "sft_trace":
        return encode_turns(tokenizer, row.as_dict(), row.fields["sft_trace"], chat)
    if kind == "messages":
        messages = row.fields["messages"]
        first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
        return encode_turns(tokenizer, {**row.as_dict(), "messages": messages[:first]}, messages[first:], chat)
    # Prompt and completion are encoded separately, as the RL sampler will see them: the prompt's
    # tokens followed by generated tokens.
    prompt = encode_prompt(tokenizer, row.as_dict(), chat)
    completion = tokenizer.encode(row.solutions[0], add_special_tokens=False)
    return prompt + completion + [tokenizer.eos_token_id], len(prompt)


class _Replay:
    """A generation client that 'generates' the given assistant turns, one per call."""

    def __init__(self):
        self.turns: List[List[int]] = []

    async def generate(self, qid, input_ids, gconfig, group_size=1):
        from realhf.system.rollout.generation_client import GenerationResult

        ids = self.turns.pop(0)
        return GenerationResult(ids, [0.0] * len(ids), [0] * len(ids), "stop", 1)


def encode_turns(tokenizer: Any, prompt_row: Dict[str, Any], turns: Sequence[Dict[str, Any]], chat: bool) -> Example:
    """The tokens of the episode that starts from `prompt_row`'s prompt and continues with `turns`,
    built by the rollouts' generation handle (realhf.system.rollout.episode.Gen), so the warm start and
    the RL episodes see identical token sequences: each assistant turn is 'generated' (its
    content, then EOS: loss on both), each run of other turns appended through the chat template
    (no loss). Turns after the last assistant turn are left out (nothing to train on)."""
    from realhf.system.rollout.episode import Gen

    replay = _Replay()

    async def build() -> Example:
        gen = Gen(
            replay,
            prompt_row["query_id"],
            encode_prompt(tokenizer, prompt_row, chat),
            GenerationHyperparameters(),
            tokenizer,
        )
        pending: List[Dict[str, Any]] = []
        for turn in turns:
            if turn["role"] != "assistant":
                pending.append(turn)
                continue
            if pending:
                gen.append(pending)
                pending = []
            replay.turns.append(tokenizer.encode(turn["content"], add_special_tokens=False) + [tokenizer.eos_token_id])
            await gen()
        return gen.ids, [0] * len(gen.prompt_ids) + gen.loss_mask

    return asyncio.run(build())


# ---- a step's batch -----------------------------------------------------------------------------


def to_train_batch(examples: Sequence[Example], pad_id: int) -> TrainBatch:
    """Right-padded rows in the trainer's layout (realhf.api.train_batch): `loss_mask` column t-1
    trains token t. Zero examples make a batch of zero rows (a rank with nothing this step still
    joins every collective)."""
    n = len(examples)
    width = max([len(ids) for ids, _ in examples] + [2])
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # [N, T]
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # [N, T]
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)  # [N, T-1]
    for i, (ids, loss) in enumerate(examples):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask[i, : len(ids)] = 1
        if isinstance(loss, int):  # everything after the prompt's `loss` tokens
            loss_mask[i, max(loss, 1) - 1 : len(ids) - 1] = True
        else:  # a flag per token; the first token is never predicted
            loss_mask[i, : len(ids) - 1] = torch.tensor(loss[1:], dtype=torch.bool)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behav_logprobs=torch.zeros(loss_mask.shape),  # [N, T-1] unused: no policy ratio here
        rewards=torch.zeros(n),  # [N] unused
        group_ids=torch.arange(n),  # [N] every row its own group
    )


def nll_sum(logits: torch.Tensor, mb: TrainBatch, rows: torch.Tensor) -> torch.Tensor:
    """The engine's `loss_fn`: Σ −log p(token) over the micro-batch's trained tokens (the engine
    divides by the trained tokens of the whole batch on all ranks: the global token mean)."""
    targets = mb.input_ids[:, 1:]  # [n, t-1]: position j predicts token j+1
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none"
    )  # [n·(t-1)]
    return (nll * mb.loss_mask.reshape(-1)).sum()


def n_trained(mb: TrainBatch) -> float:
    """The engine's `loss_weight_fn`: the trained tokens `nll_sum` covers."""
    return float(mb.loss_mask.sum())


def split_by_tokens(lengths: Sequence[int], n_ranks: int) -> List[List[int]]:
    """Which examples of a step each rank trains: Karmarkar–Karp over their token counts, so the
    ranks' shares are about equal; every rank computes the same split from the same batch. One
    rank keeps the batch in its order."""
    return karmarkar_karp(list(lengths), n_ranks)


# ---- one rank -----------------------------------------------------------------------------------


def engine_config(
    cfg: EngineRunConfig, rank: int, value_head: bool = False, name: str = "sft", trainable: bool = True
) -> FSDPEngineConfig:
    """The RL actor's engine with SFT's optimizer: AdamW, `warmup_steps` of linear warm-up, then
    cosine to 0 at `steps`; `value_head`: one output per position (a reward model's). A config
    without micro_batch_tokens (RMConfig) takes each rank's share of the batch in one forward."""
    optimizer = OptimizerConfig(
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="cosine",
        # The schedule warms up for int(proportion · steps) steps; half a step more than
        # warmup_steps keeps float rounding from ever making that one step fewer.
        warmup_steps_proportion=(cfg.warmup_steps + 0.5) / cfg.steps,
        gradient_clipping=cfg.grad_clip,
    )
    model = ModelTrainEvalConfig(
        path=cfg.model_path,
        dtype=cfg.dtype,
        n_threads=cfg.n_threads,
        gradient_checkpointing=cfg.gradient_checkpointing,
        param_dtype=cfg.param_dtype,
        optimizer=optimizer,
        lora=cfg.lora,
    )
    return FSDPEngineConfig(
        model=model,
        total_steps=cfg.steps,
        device=cfg.device,
        local_rank=rank,
        param_dtype=cfg.param_dtype or None,
        micro_batch_tokens=getattr(cfg, "micro_batch_tokens", 0),
        shared_prompt=False,  # an SFT row, or a preference pair's answer, is a group of one
        value_head=value_head,
        trainable=trainable,
        seed=cfg.seed,
        name=name,
    )


def load_training_rows(cfg: SFTConfig) -> List[PromptRow]:
    """train_path's rows (the first `max_train_rows`), each checked to have something to train on."""
    rows = load_prompts(cfg.train_path, required=(), columns=cfg.dataset.columns, split=cfg.dataset.split)
    if cfg.max_train_rows > 0:
        rows = rows[: cfg.max_train_rows]
    for row in rows:
        target_of(row)
    return rows


def join_group(cfg: EngineRunConfig, rank: int, world: int, device: torch.device, store_addr: str) -> None:
    """The process group the engine shards over; its timeout bounds every collective."""
    timeout = timedelta(seconds=cfg.collective_timeout)
    if world == 1:
        dist.init_process_group(dist_backend(device), store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        return
    host, port = store_addr.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=False, timeout=timedelta(seconds=cfg.distributed_timeout))
    bind_gloo_to(host)
    dist.init_process_group(dist_backend(device), store=store, rank=rank, world_size=world, timeout=timeout)


@dataclass
class RankSession:
    """What one rank of training/main_sft.py or main_rm.py holds: its device, the tokenizer and
    how it encodes rows, and the engine (destroyed, with the process group, when the rank ends)."""

    cfg: EngineRunConfig
    rank: int
    device: torch.device
    tokenizer: Any
    chat: bool
    pad_id: int
    engine: Optional[FSDPEngine] = None
    frozen: Optional[FSDPEngine] = None  # a reference beside it (main_rm.py kind=implicit)

    def open_engine(self, value_head: bool = False, name: str = "sft", trainable: bool = True) -> FSDPEngine:
        # Waits on rank 0's write of the output go through a group with the disk's timeout.
        engine = FSDPEngine(
            engine_config(self.cfg, self.rank, value_head=value_head, name=name, trainable=trainable),
            io_group=collectives.new_gloo_group(self.cfg.distributed_timeout),
        )
        if trainable:
            self.engine = engine
        else:
            self.frozen = engine
        engine.initialize()
        return engine


@contextlib.contextmanager
def rank_session(cfg: EngineRunConfig, rank: int, world: int, store_addr: str) -> Iterator[RankSession]:
    """Threads, seeds, the rank's device and process group (`store_addr`: the launcher's
    rendezvous store, host:port, when `world` > 1), then the tokenizer; everything left on exit."""
    torch.set_num_threads(cfg.n_threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = pick_device(cfg.device, rank)
    bind_device(device)
    join_group(cfg, rank, world, device, store_addr)
    session: Optional[RankSession] = None
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        chat = chat_template_on(cfg.dataset.chat_template, tokenizer)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        session = RankSession(cfg, rank, device, tokenizer, chat, pad_id)
        yield session
    finally:
        for engine in (session.engine, session.frozen) if session is not None else ():
            if engine is not None:
                engine.destroy()
        dist.destroy_process_group()


def run_rank(cfg: SFTConfig, rank: int = 0, world: int = 1, store_addr: str = "", log: Log = print) -> Dict[str, Any]:
    """Train rank `rank` of `world` (every rank runs this, with the same config) and write
    output_path; returns the report (losses, timings, parameter counts), complete on rank 0."""
    with rank_session(cfg, rank, world, store_addr) as session:
        tokenizer, chat, pad_id, device = session.tokenizer, session.chat, session.pad_id, session.device
        rows = load_training_rows(cfg)
        engine = session.open_engine()
        n_params, n_trainable = engine.n_params, engine.n_trainable
        adapters = (
            f" (LoRA r={cfg.lora.r}: {n_trainable / 1e6:.3f}M trainable, {100 * n_trainable / n_params:.2f}%)"
            if cfg.lora.r > 0
            else ""
        )
        log(
            f"SFT: {n_params / 1e6:.2f}M parameters{adapters}, {len(rows)} training rows, {cfg.steps} steps x "
            f"{cfg.batch_size}, DP={world} on {device} ({dist.get_backend()})"
        )

        sampler = PromptSampler(rows, seed=cfg.seed)
        encoded: Dict[str, Example] = {}  # by query_id: each row is tokenized once, when first drawn
        losses: List[float] = []
        n_tokens, my_tokens = 0, 0
        start = time.perf_counter()
        for step in range(cfg.steps):
            drawn = sampler.next_batch(cfg.batch_size)
            for r in drawn:
                if r.query_id not in encoded:
                    encoded[r.query_id] = encode_example(tokenizer, r, chat)
            examples = [encoded[r.query_id] for r in drawn]
            lengths = [len(ids) for ids, _ in examples]
            mine = split_by_tokens(lengths, world)[rank]
            batch = to_train_batch([examples[i] for i in mine], pad_id)
            try:
                stats = engine.train_batch(batch, nll_sum, n_trained)
            except collectives.CollectiveTimeoutError as e:
                raise e.at(f"step {step + 1}", "collective_timeout") from None
            losses.append(stats["loss"])
            n_tokens += sum(lengths)
            my_tokens += sum(lengths[i] for i in mine)
            if (step + 1) % cfg.log_interval == 0 or step + 1 == cfg.steps:
                elapsed = time.perf_counter() - start
                log(
                    f"step {step + 1}/{cfg.steps} loss {stats['loss']:.4f} lr {stats['lr']:.2e} "
                    f"epoch {sampler.epoch} {n_tokens / elapsed:.0f} tok/s {elapsed:.1f} s"
                )
        train_seconds = time.perf_counter() - start
        engine.save_hf(Path(cfg.output_path), tokenizer_source=cfg.model_path)
        collectives.barrier()  # the ranks leave the group together
        return {
            "losses": losses,
            "train_seconds": train_seconds,
            "tokens_per_s": n_tokens / train_seconds,
            "rank_token_share": my_tokens / max(n_tokens, 1),
            "n_params": n_params,
            "n_trainable": n_trainable,
            "dp": world,
        }


# ---- the ranks of one command -------------------------------------------------------------------


def _rank_env() -> Dict[str, str]:
    """The ranks import the realhf this process runs (a checkout need not be installed): its
    package root first on the path, and not the working directory (`-m` would put it first;
    PYTHONSAFEPATH, Python >= 3.11), where another checkout may sit."""
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONSAFEPATH="1")


def _first_error(workdir: Path, procs: List[subprocess.Popen]) -> SFTRankError:
    """The error that ended the run: the earliest one a rank wrote (a rank that fails makes its
    peers fail after it, in their collectives), else the first rank that exited badly."""
    errors = []
    for f in workdir.glob("error-rank*.json"):
        try:
            errors.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    world = len(procs)
    if errors:
        first = min(errors, key=lambda e: e["time"])
        return SFTRankError(
            f"rank {first['rank']}/{world}: {first['error']}; the other ranks were stopped", first["traceback"]
        )
    for rank, p in enumerate(procs):
        code = p.poll()
        if code not in (None, 0):
            how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
            return SFTRankError(f"rank {rank}/{world} {how} without reporting an error; the other ranks were stopped")
    return SFTRankError("a rank failed; the other ranks were stopped")


def launch_ranks(cfg: EngineRunConfig, log: Log = print, poll_s: float = 0.1, kind: str = "sft") -> Dict[str, Any]:
    """Run `cfg.dp` ranks of `kind` ("sft", or "rm": realhf.experiments.rm) as processes
    (`python -m realhf.apps.sft_rank`) and wait for them; rank 0's report. The ranks meet at a store this process holds; each runs in a session of its own
    (Ctrl-C reaches only this process) and is killed by the kernel if this process dies. The
    first rank to fail ends the others at once and its error is raised (SFTRankError); Ctrl-C
    (KeyboardInterrupt) ends them all too."""
    from omegaconf import OmegaConf

    workdir = Path(tempfile.mkdtemp(prefix="realhf-sft-"))
    config_path = workdir / "config.yaml"
    OmegaConf.save(OmegaConf.structured(cfg), config_path)
    # TCPStore given a host still listens on every interface; a socket bound here keeps it on
    # loopback. The store owns the socket from here on (it closes it when it goes).
    listener = socket.create_server((_HOST, 0))
    port = listener.getsockname()[1]
    store = dist.TCPStore(
        _HOST,
        port,
        cfg.dp,
        is_master=True,
        timeout=timedelta(seconds=cfg.distributed_timeout),
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )
    store_addr = f"{_HOST}:{store.port}"
    env = _rank_env()
    procs: List[subprocess.Popen] = []
    # Ctrl-C must end the ranks even where SIGINT was ignored when this process started (a job
    # started in the background by a non-interactive shell): the training launcher does the same.
    restore = None
    if threading.current_thread() is threading.main_thread():
        restore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for rank in range(cfg.dp):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        *RANK_COMMAND,
                        kind,
                        str(config_path),
                        str(rank),
                        str(cfg.dp),
                        store_addr,
                        str(workdir),
                    ],
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=die_with_parent,
                )  # fmt: skip
            )
        log(f"{kind.upper()}: started {cfg.dp} DP ranks (pids {', '.join(str(p.pid) for p in procs)})")
        while True:
            codes = [p.poll() for p in procs]
            if all(c == 0 for c in codes):
                break
            if any(c not in (None, 0) for c in codes):
                raise _first_error(workdir, procs)
            time.sleep(poll_s)
        return json.loads((workdir / "report.json").read_text())
    finally:
        kill_process_trees([p.pid for p in procs if p.poll() is None], timeout=5.0)
        for p in procs:
            p.wait()
        del store
        shutil.rmtree(workdir, ignore_errors=True)
        if restore is not None:
            signal.signal(signal.SIGINT, restore)


# ---- the command --------------------------------------------------------------------------------


def train_sft(cfg: SFTConfig, log: Log = print) -> Dict[str, Any]:
    """Validate, train (in this process at dp=1, else on `dp` rank processes), write output_path,
    then report greedy and sampled (T=1) accuracy on test_path (eval_n >= 0). Returns the report:
    the loss of every step, timings, parameter counts and the accuracies."""
    from realhf.experiments.validation import ConfigError, check_sft  # the ranks need none of it

    try:
        check_sft(cfg)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    report = run_rank(cfg, log=log) if cfg.dp == 1 else launch_ranks(cfg, log)
    out = Path(cfg.output_path)
    log(f"saved {out}")
    if cfg.eval_n >= 0:
        test = load_prompts(cfg.test_path, columns=cfg.dataset.columns, split=cfg.dataset.test_split)
        test = test[: cfg.eval_n] if cfg.eval_n > 0 else test
        with MathGrader(n_workers=1) as grader:
            for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
                res = evaluate_math_accuracy(
                    out, test, temperature=temperature, n=1, max_new_tokens=cfg.max_new_tokens,
                    batch_size=cfg.eval_batch_size, grader=grader, seed=cfg.seed,
                    chat_template=cfg.dataset.chat_template,
                )  # fmt: skip
                report[name] = res["accuracy"]
                log(f"{name} (T={temperature:g}) accuracy on {res['n']} test prompts: {res['accuracy']:.3f}")
    return report
