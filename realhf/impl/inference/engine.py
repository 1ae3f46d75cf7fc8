"""The native inference engine: slot-based continuous batching over a static KV cache.

One engine thread runs the loop; every other thread talks to it through a request queue and a
command queue and gets `concurrent.futures.Future`s back (`asyncio.wrap_future` makes them
awaitable). One turn of the loop:

    1. apply commands          pause / continue / abort a rid / swap weights / flush
    2. admit waiting requests  prefill them into free slots n..n+b-1, sample their first token
    3. decode                  one token for every running slot 0..n-1, sampled in one batch
    4. retire finished ones    resolve their futures, move the last slots into the holes

so new requests join between decode steps and finished ones leave at once. Running requests
always occupy slots 0..n-1 (see `StaticKVTransformer`), and every per-slot state lives in a
tensor indexed by slot, so a decode step is a fixed number of tensor ops whatever n is.

Per-token log-probs are those of `realhf.impl.inference.sampling` (log_softmax(logits / T) at the
sampled token; greedy: T treated as 1).

Weight versions: a weight swap happens between decode steps. Requests still running when new
weights land are returned with `abort` and their partial output first (all of it produced by the
old weights), so each response carries exactly one `weight_version`. The GserverManager pauses
servers before updating them anyway, so normally nothing is running at that moment.

The model behind the engine is a "runner" (`ModelRunner`): `StaticKVRunner` here for the
Qwen2/Llama family, `realhf.impl.inference.hf_engine.HFRunner` for any other HF causal LM.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Tuple

import torch

from realhf.base import logging
from realhf.impl.inference.sampling import sample
from realhf.impl.inference.transformer import (
    SUPPORTED_MODEL_TYPES,
    StaticKVTransformer,
    load_model,
    parse_dtype,
    read_hf_config,
)

logger = logging.getLogger("engine")

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
# Prompts per prefill forward. Chunks of similar-length prompts pad little; 16 prompts of ~32
# tokens still make matmuls big enough to run at full speed (256 bench prompts: 0.85 s in
# chunks of 64, 0.70 s in chunks of 16).
_PREFILL_CHUNK = 16


# --------------------------------------------------------------------------------------------
# Requests and results
# --------------------------------------------------------------------------------------------


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = -1  # -1: off
    min_new_tokens: int = 0  # stop tokens are masked out until this many tokens exist
    stop_token_ids: List[int] = field(default_factory=list)
    ignore_eos: bool = False


@dataclass
class GenerateRequest:
    input_ids: List[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    rid: str = ""


@dataclass
class GenerateResult:
    rid: str
    output_ids: List[int]
    output_logprobs: List[float]
    finish_reason: Dict[str, Any]  # {"type": "stop"|"length"|"abort", ...} as SGLang
    prompt_tokens: int
    weight_version: int
    e2e_latency: float

    def to_sglang(self, return_logprob: bool = True) -> Dict[str, Any]:
        """The `/generate` response body of DESIGN §5."""
        meta: Dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
            "weight_version": self.weight_version,
            "e2e_latency": self.e2e_latency,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(self.output_logprobs, self.output_ids)]
        return {"output_ids": self.output_ids, "meta_info": meta}


class EngineClosedError(RuntimeError):
    pass


def check_request(req: GenerateRequest, vocab_size: int, context_len: int) -> Optional[str]:
    """Why a request cannot be served (a message naming the field), or None."""
    s = req.sampling
    if not req.input_ids:
        return "input_ids is empty: at least one prompt token is needed"
    bad = [t for t in req.input_ids if not 0 <= t < vocab_size]
    if bad:
        return f"input_ids contains token ids outside [0, {vocab_size}): {bad[:5]}"
    if s.max_new_tokens < 0:
        return f"sampling_params.max_new_tokens must be >= 0, got {s.max_new_tokens}"
    if len(req.input_ids) + s.max_new_tokens > context_len:
        return (f"prompt ({len(req.input_ids)} tokens) + sampling_params.max_new_tokens ({s.max_new_tokens}) "
                f"exceeds the context length {context_len}")
    if s.min_new_tokens < 0 or s.min_new_tokens > max(s.max_new_tokens, 0):
        return f"sampling_params.min_new_tokens must be in [0, max_new_tokens], got {s.min_new_tokens}"
    if not s.temperature >= 0:
        return f"sampling_params.temperature must be >= 0, got {s.temperature}"
    if not 0 < s.top_p <= 1:
        return f"sampling_params.top_p must be in (0, 1], got {s.top_p}"
    if s.top_k == 0 or s.top_k < -1:
        return f"sampling_params.top_k must be -1 (off) or >= 1, got {s.top_k}"
    bad = [t for t in s.stop_token_ids if not 0 <= t < vocab_size]
    if bad:
        return f"sampling_params.stop_token_ids contains ids outside [0, {vocab_size}): {bad[:5]}"
    return None


# --------------------------------------------------------------------------------------------
# Model runners
# --------------------------------------------------------------------------------------------


class ModelRunner(Protocol):
    """What the engine needs from a model: a slotted cache with prefill, decode and moves."""

    vocab_size: int
    context_len: int
    n_slots: int
    eos_token_ids: List[int]

    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor: ...

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None: ...

    def load_weights(self, model_path: str) -> Any:
        """New weights from a checkpoint, in new tensors; callable from any thread."""

    def set_weights(self, weights: Any) -> None: ...


class StaticKVRunner:
    """The Qwen2/Llama-family `StaticKVTransformer` as a ModelRunner."""

    kind = "static_kv"

    def __init__(self, model_path: str, n_slots: int, context_len: int = 0, dtype: str = "float32",
                 attention: str = "auto"):
        self.dtype = parse_dtype(dtype)
        args, weights = load_model(model_path, self.dtype)
        context_len = context_len or args.max_position_embeddings
        self.model = StaticKVTransformer(args, weights, n_slots, context_len, self.dtype, attention)
        self.attention = "C kernel" if self.model.attention_kernel is not None else "torch matmuls"
        self.args = args
        self.vocab_size = args.vocab_size
        self.context_len = context_len
        self.n_slots = n_slots
        self.eos_token_ids = list(args.eos_token_ids)

    def prefill(self, slots, tokens, lengths):
        return self.model.prefill(slots, tokens, lengths)

    def decode(self, tokens, positions):
        return self.model.decode(tokens, positions)

    def move_slots(self, src, dst, length):
        self.model.move_slots(src, dst, length)

    def load_weights(self, model_path: str):
        args, weights = load_model(model_path, self.dtype)
        if args.shape_signature() != self.args.shape_signature():
            raise ValueError(
                f"checkpoint {model_path!r} has shape {args.shape_signature()} but the running model has "
                f"{self.args.shape_signature()}; a weight update cannot change the architecture"
            )
        return weights

    def set_weights(self, weights) -> None:
        self.model.set_weights(weights)


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@dataclass
class _Req:
    req: GenerateRequest
    future: Future
    t_submit: float
    stop_ids: List[int]  # EOS (unless ignore_eos) + stop_token_ids


@dataclass
class EngineStats:
    running: int
    queued: int
    paused: bool
    weight_version: int
    n_slots: int
    context_len: int
    token_usage: float  # cache columns in use / capacity
    prompt_tokens_total: int
    generation_tokens_total: int
    requests_total: int
    aborted_total: int
    gen_throughput: float  # tokens/s over the last few seconds


class Engine:
    """Continuous batching over a ModelRunner, driven by one engine thread.

    Thread-safe: `submit`, `pause`, `resume`, `abort`, `abort_all`, `flush_cache` return
    Futures; `update_weights` blocks its caller (it loads the checkpoint in the caller's thread,
    so decoding goes on meanwhile) until the swap happened.
    """

    def __init__(self, runner: ModelRunner, *, weight_version: int = 0, seed: int = 1, n_threads: int = 1,
                 model_path: str = "", max_prefill_tokens: int = 16384, name: str = "engine"):
        self.runner = runner
        self.model_path = model_path
        self.weight_version = int(weight_version)
        self.n_threads = n_threads
        self.max_prefill_tokens = max_prefill_tokens
        self.name = name
        torch.set_num_threads(n_threads)
        self.generator = torch.Generator().manual_seed(seed)

        S, C = runner.n_slots, runner.context_len
        self.vocab_size, self.context_len, self.n_slots = runner.vocab_size, C, S
        # Per-slot state, rows 0..n_active-1 in use.
        self.seq_len = torch.zeros(S, dtype=torch.long)  # prompt + generated (last token not yet cached)
        self.last_tok = torch.zeros(S, dtype=torch.long)
        self.n_gen = torch.zeros(S, dtype=torch.long)
        self.max_new = torch.zeros(S, dtype=torch.long)
        self.min_new = torch.zeros(S, dtype=torch.long)
        self.temp = torch.ones(S, dtype=torch.float32)
        self.top_p = torch.ones(S, dtype=torch.float32)
        self.top_k = torch.full((S,), self.vocab_size, dtype=torch.long)
        self.stop_ids = torch.full((S, 1), -1, dtype=torch.long)  # padded with -1; widened on demand
        self.out_tok = torch.zeros(S, C, dtype=torch.long)
        self.out_lp = torch.zeros(S, C, dtype=torch.float32)
        self.slot_req: List[_Req] = []
        # Python counters of the running rows, so a step never reduces a tensor to learn them.
        self._n_greedy = 0
        self._n_filter = 0
        self._n_min_new = 0

        self._waiting: Deque[_Req] = collections.deque()
        self._live: Dict[str, _Req] = {}  # rid -> request, queued or running
        self._live_lock = threading.Lock()
        self._commands: Deque[Tuple[Callable[[], Any], Future]] = collections.deque()
        self._wake = threading.Event()
        self._paused = False
        self._stopping = False
        self._closed = False
        self._error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.aborted_total = 0
        self._tput = 0.0
        self._tput_mark = (time.monotonic(), 0)
        self._last_log = time.monotonic()

    # ---- public API (any thread) ------------------------------------------------------------
    @property
    def n_active(self) -> int:
        return len(self.slot_req)

    def start(self) -> "Engine":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"{self.name}-loop", daemon=True)
            self._thread.start()
        return self

    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._error is None

    def check_request(self, req: GenerateRequest) -> Optional[str]:
        return check_request(req, self.vocab_size, self.context_len)

    def submit(self, req: GenerateRequest) -> Future:
        """Queue a request; the Future resolves to a GenerateResult. Raises ValueError on a bad
        request (message naming the field) or a rid that is already running."""
        err = self.check_request(req)
        if err:
            raise ValueError(err)
        if not req.rid:
            req.rid = uuid.uuid4().hex
        s = req.sampling
        stop = list(dict.fromkeys(list(s.stop_token_ids) + ([] if s.ignore_eos else self.runner.eos_token_ids)))
        r = _Req(req, Future(), time.monotonic(), stop)
        with self._live_lock:
            self._raise_if_closed()
            if req.rid in self._live:
                raise ValueError(f"rid {req.rid!r} is already queued or running")
            self._live[req.rid] = r
            self._waiting.append(r)  # under the lock: stop() cannot miss it when draining
        self._wake.set()
        return r.future

    def pause(self) -> Future:
        """Running requests end now with `abort` and their partial output; queued ones wait."""
        return self._post(self._do_pause)

    def resume(self) -> Future:
        return self._post(self._do_resume)

    def abort(self, rid: str) -> Future:
        """End one request (queued or running) with `abort`; resolves to whether it was found."""
        return self._post(lambda: self._do_abort(rid))

    def abort_all(self) -> Future:
        return self._post(self._do_abort_all)

    def flush_cache(self) -> Future:
        # No prefix cache: the slot cache holds running requests only, nothing to flush.
        return self._post(lambda: True)

    def update_weights(self, model_path: str, weight_version: Optional[int] = None, timeout: float = 300.0) -> int:
        """Load `model_path` here, swap it in between two decode steps, return the new version
        (default: current + 1). Raises on a bad checkpoint; the old weights stay in place."""
        t0 = time.monotonic()
        weights = self.runner.load_weights(model_path)
        t_load = time.monotonic() - t0

        def swap():
            old = self.weight_version
            new = old + 1 if weight_version is None else int(weight_version)
            n_aborted = self._abort_running(f"weights updated to version {new}")
            self.runner.set_weights(weights)
            self.weight_version = new
            self.model_path = model_path
            logger.info(f"{self.name}: weights v{old} -> v{self.weight_version} from {model_path} "
                        f"(load {t_load * 1e3:.0f} ms; {n_aborted} running requests aborted)")
            return self.weight_version

        return self._post(swap).result(timeout=timeout)

    def stats(self) -> EngineStats:
        n = self.n_active
        used = int(self.seq_len[:n].sum()) if n else 0
        t0, tok0 = self._tput_mark
        elapsed = time.monotonic() - t0
        # The loop refreshes the rate while decoding; an idle engine decays it here.
        tput = self._tput if elapsed < 5.0 else (self.generation_tokens_total - tok0) / elapsed
        return EngineStats(
            running=n, queued=len(self._waiting), paused=self._paused, weight_version=self.weight_version,
            n_slots=self.n_slots, context_len=self.context_len,
            token_usage=used / float(self.n_slots * self.context_len),
            prompt_tokens_total=self.prompt_tokens_total, generation_tokens_total=self.generation_tokens_total,
            requests_total=self.requests_total, aborted_total=self.aborted_total, gen_throughput=tput,
        )

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop; every queued or running request resolves with `abort`. Idempotent."""
        with self._live_lock:
            self._closed = True
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                logger.error(f"{self.name}: engine thread did not stop within {timeout:.0f}s")
        self._drain("server shutting down")

    # ---- internals: command plumbing ----------------------------------------------------------
    def _raise_if_closed(self):
        if self._error is not None:
            raise EngineClosedError(f"{self.name}: engine thread died: {self._error!r}")
        if self._closed:
            raise EngineClosedError(f"{self.name}: engine is stopped")

    def _post(self, fn: Callable[[], Any]) -> Future:
        fut: Future = Future()
        with self._live_lock:
            self._raise_if_closed()
            self._commands.append((fn, fut))
        self._wake.set()
        return fut

    def _drain(self, reason: str) -> None:
        """Resolve everything still pending (engine stopped or dead)."""
        while self._commands:
            _, fut = self._commands.popleft()
            if not fut.done():
                fut.set_exception(EngineClosedError(f"{self.name}: {reason}"))
        try:
            self._abort_running(reason)
        except Exception:  # broken slot state after a failure: resolve without partial output
            for r in self.slot_req:
                self._finish(r, [], [], self._abort_reason(reason))
            self.slot_req.clear()
        while self._waiting:
            self._finish_queued(self._waiting.popleft(), reason)

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.n_threads)  # the OpenMP setting is per thread
        try:
            while not self._stopping:
                self._wake.clear()
                self._apply_commands()
                if not self._paused and self._waiting and self.n_active < self.n_slots:
                    self._admit()
                if self.n_active:
                    self._decode_step()
                    self._maybe_log()
                elif not self._commands and (self._paused or not self._waiting):
                    self._wake.wait(0.5)
        except BaseException as e:  # a bug: fail every pending request instead of hanging them
            logger.exception(f"{self.name}: engine loop failed: {e}")
            self._error = e
            with self._live_lock:
                self._closed = True
            self._drain(f"engine failed: {e!r}")

    def _apply_commands(self) -> None:
        while self._commands:
            fn, fut = self._commands.popleft()
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)

    def _do_pause(self):
        self._paused = True
        n = self._abort_running("generation paused")
        logger.info(f"{self.name}: paused ({n} running requests aborted, {len(self._waiting)} queued)")
        return n

    def _do_resume(self):
        was = self._paused
        self._paused = False
        if was:
            logger.info(f"{self.name}: continued ({len(self._waiting)} queued)")
        return True

    def _do_abort(self, rid: str) -> bool:
        for slot, r in enumerate(self.slot_req):
            if r.req.rid == rid:
                self._retire([slot], [self._abort_reason("aborted by request")])
                return True
        for r in list(self._waiting):
            if r.req.rid == rid:
                self._waiting.remove(r)
                self._finish_queued(r, "aborted by request")
                return True
        return False

    def _do_abort_all(self) -> int:
        n = self._abort_running("aborted by request")
        while self._waiting:
            self._finish_queued(self._waiting.popleft(), "aborted by request")
            n += 1
        return n

    @staticmethod
    def _abort_reason(message: str) -> Dict[str, Any]:
        return {"type": "abort", "message": message}

    def _abort_running(self, message: str) -> int:
        n = self.n_active
        if n:
            self._retire(list(range(n)), [self._abort_reason(message)] * n)
        return n

    # ---- admission (prefill) ------------------------------------------------------------------
    def _admit(self) -> None:
        free = self.n_slots - self.n_active
        batch: List[_Req] = []
        width = 0
        while self._waiting and len(batch) < free:
            r = self._waiting[0]
            n_prompt = len(r.req.input_ids)
            # Bound the padded prefill batch; a single long prompt always goes through.
            if batch and (len(batch) + 1) * max(width, n_prompt) > self.max_prefill_tokens:
                break
            self._waiting.popleft()
            if r.req.sampling.max_new_tokens == 0:
                self._finish(r, [], [], {"type": "length", "length": 0})
                continue
            batch.append(r)
            width = max(width, n_prompt)
        if not batch:
            return

        # Shortest prompts first, prefilled in chunks of similar length: padding to the longest
        # prompt of the whole batch would waste up to a third of the prefill compute.
        batch.sort(key=lambda r: len(r.req.input_ids))
        lo, b = self.n_active, len(batch)
        hi = lo + b
        lengths = torch.tensor([len(r.req.input_ids) for r in batch])

        # Per-slot sampling state of the new rows.
        sp = [r.req.sampling for r in batch]
        self.temp[lo:hi] = torch.tensor([s.temperature for s in sp], dtype=torch.float32)
        self.top_p[lo:hi] = torch.tensor([s.top_p for s in sp], dtype=torch.float32)
        self.top_k[lo:hi] = torch.tensor([s.top_k if s.top_k > 0 else self.vocab_size for s in sp])
        # Capped by the room left in the context, so one comparison per step covers both limits.
        self.max_new[lo:hi] = torch.tensor([min(r.req.sampling.max_new_tokens, self.context_len - len(r.req.input_ids))
                                            for r in batch])
        self.min_new[lo:hi] = torch.tensor([s.min_new_tokens for s in sp])
        width_stop = max(1, max(len(r.stop_ids) for r in batch))
        if width_stop > self.stop_ids.shape[1]:
            wider = torch.full((self.n_slots, width_stop), -1, dtype=torch.long)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[lo:hi] = -1
        for i, r in enumerate(batch):
            if r.stop_ids:
                self.stop_ids[lo + i, : len(r.stop_ids)] = torch.tensor(r.stop_ids)
        self.n_gen[lo:hi] = 0
        self.seq_len[lo:hi] = lengths
        self.slot_req.extend(batch)
        for s in sp:
            self._count(s, +1)
        self.prompt_tokens_total += int(lengths.sum())

        parts = []
        for c0 in range(0, b, _PREFILL_CHUNK):
            chunk = batch[c0 : c0 + _PREFILL_CHUNK]
            tokens = torch.zeros(len(chunk), len(chunk[-1].req.input_ids), dtype=torch.long)
            for i, r in enumerate(chunk):
                tokens[i, : len(r.req.input_ids)] = torch.tensor(r.req.input_ids)
            slots = torch.arange(lo + c0, lo + c0 + len(chunk))
            parts.append(self.runner.prefill(slots, tokens, lengths[c0 : c0 + len(chunk)]))
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        self._sample_append_retire(logits, lo, hi)

    def _count(self, s: SamplingParams, sign: int) -> None:
        self._n_greedy += sign * (s.temperature <= 0)
        self._n_filter += sign * (s.top_k > 0 or s.top_p < 1)
        self._n_min_new += sign * (s.min_new_tokens > 0)

    # ---- one decode step ------------------------------------------------------------------------
    def _decode_step(self) -> None:
        n = self.n_active
        logits = self.runner.decode(self.last_tok[:n], self.seq_len[:n] - 1)
        self._sample_append_retire(logits, 0, n)

    def _sample_append_retire(self, logits: torch.Tensor, lo: int, hi: int) -> None:
        """Sample one token for rows lo..hi-1 from their logits, append it, retire finished rows."""
        n_gen = self.n_gen[lo:hi]
        stop_ids = self.stop_ids[lo:hi]
        if self._n_min_new:
            # Rows below min_new_tokens must not stop: their stop tokens get probability 0 (as
            # SGLang's min-new-tokens penalizer; the log-probs are those of the masked logits).
            below = n_gen < self.min_new[lo:hi]
            if bool(below.any()):
                rows, cols = ((stop_ids >= 0) & below[:, None]).nonzero(as_tuple=True)
                logits = logits.clone()
                logits[rows, stop_ids[rows, cols]] = float("-inf")
        n = hi - lo
        tokens, logprobs = sample(
            logits, self.temp[lo:hi], self.top_p[lo:hi], self.top_k[lo:hi],
            all_greedy=self._n_greedy == self.n_active, any_greedy=self._n_greedy > 0,
            any_filter=self._n_filter > 0, generator=self.generator,
        )
        rows = torch.arange(lo, hi)
        self.out_tok[rows, n_gen] = tokens
        self.out_lp[rows, n_gen] = logprobs
        n_gen += 1  # in place: views of the slot state
        self.seq_len[lo:hi] += 1
        self.last_tok[lo:hi] = tokens
        self.generation_tokens_total += n

        hit_stop = (stop_ids == tokens[:, None]).any(dim=1)
        done = hit_stop | (n_gen >= self.max_new[lo:hi])  # max_new is capped by the context left
        if not bool(done.any()):
            return
        idx = done.nonzero().flatten().tolist()
        stops = hit_stop[idx].tolist()
        toks = tokens[idx].tolist()
        reasons = []
        for i, stopped, tok in zip(idx, stops, toks):
            if stopped:
                reasons.append({"type": "stop", "matched": tok})
            else:
                reasons.append({"type": "length", "length": int(self.n_gen[lo + i])})
        self._retire([lo + i for i in idx], reasons)

    # ---- leaving --------------------------------------------------------------------------------
    def _retire(self, slots: List[int], reasons: List[Dict[str, Any]]) -> None:
        """Resolve the requests in `slots` and compact the running rows to 0..n'-1."""
        for slot, reason in zip(slots, reasons):
            r = self.slot_req[slot]
            g = int(self.n_gen[slot])
            self._finish(r, self.out_tok[slot, :g].tolist(), self.out_lp[slot, :g].tolist(), reason)
            self._count(r.req.sampling, -1)
        n = self.n_active
        keep = n - len(slots)
        gone = set(slots)
        holes = [s for s in sorted(gone) if s < keep]
        movers = [s for s in range(keep, n) if s not in gone]
        if holes:
            src, dst = torch.tensor(movers), torch.tensor(holes)
            self.runner.move_slots(src, dst, int(self.seq_len[src].max()))
            for t in (self.seq_len, self.last_tok, self.n_gen, self.max_new, self.min_new, self.temp,
                      self.top_p, self.top_k, self.stop_ids):
                t[dst] = t[src]
            g = int(self.n_gen[dst].max())
            self.out_tok[dst, :g] = self.out_tok[src, :g]
            self.out_lp[dst, :g] = self.out_lp[src, :g]
            for h, m in zip(holes, movers):
                self.slot_req[h] = self.slot_req[m]
        del self.slot_req[keep:]

    def _finish_queued(self, r: _Req, message: str) -> None:
        self._finish(r, [], [], self._abort_reason(message))

    def _finish(self, r: _Req, ids: List[int], lps: List[float], reason: Dict[str, Any]) -> None:
        with self._live_lock:
            self._live.pop(r.req.rid, None)
        self.requests_total += 1
        self.aborted_total += reason["type"] == "abort"
        result = GenerateResult(
            rid=r.req.rid, output_ids=ids, output_logprobs=lps, finish_reason=reason,
            prompt_tokens=len(r.req.input_ids), weight_version=self.weight_version,
            e2e_latency=time.monotonic() - r.t_submit,
        )
        if not r.future.done():
            r.future.set_result(result)

    def _maybe_log(self) -> None:
        now = time.monotonic()
        t0, tok0 = self._tput_mark
        if now - t0 >= 2.0:
            self._tput = (self.generation_tokens_total - tok0) / (now - t0)
            self._tput_mark = (now, self.generation_tokens_total)
        if now - self._last_log >= 30.0:
            self._last_log = now
            logger.info(f"{self.name}: running={self.n_active} queued={len(self._waiting)} "
                        f"version={self.weight_version} gen={self._tput:.0f} tok/s "
                        f"total_tokens={self.generation_tokens_total} requests={self.requests_total}")


# --------------------------------------------------------------------------------------------
# Construction from a model directory
# --------------------------------------------------------------------------------------------


def engine_kind_for(model_path: str, kind: str = "auto") -> str:
    if kind not in ("auto", "static_kv", "hf"):
        raise ValueError(f"engine kind must be 'auto', 'static_kv' or 'hf', got {kind!r}")
    if kind != "auto":
        return kind
    return "static_kv" if read_hf_config(model_path).get("model_type") in SUPPORTED_MODEL_TYPES else "hf"


def create_engine(model_path: str, *, kind: str = "auto", max_running_requests: int = 256, context_length: int = 0,
                  dtype: str = "float32", n_threads: int = 1, seed: int = 1, weight_version: int = 0,
                  name: str = "engine", attention: str = "auto") -> Engine:
    """An (unstarted) engine for an HF model directory: the static-KV runner for Qwen2/Llama,
    the HF-forward fallback for anything else (kind='auto'). `attention` picks the static-KV
    runner's decode attention: 'auto' (the C kernel if it builds here), 'kernel' or 'torch'."""
    torch.set_num_threads(n_threads)
    kind = engine_kind_for(model_path, kind)
    t0 = time.monotonic()
    if kind == "static_kv":
        runner = StaticKVRunner(model_path, max_running_requests, context_length, dtype, attention)
    else:
        from realhf.impl.inference.hf_engine import HFRunner

        runner = HFRunner(model_path, max_running_requests, context_length, dtype)
    logger.info(f"{name}: {kind} runner for {model_path} ({time.monotonic() - t0:.1f}s): "
                f"{runner.n_slots} slots x {runner.context_len} tokens, vocab {runner.vocab_size}, "
                f"{dtype}, {n_threads} thread(s), decode attention {getattr(runner, 'attention', 'hf forward')}, "
                f"weight version {weight_version}")
    return Engine(runner, weight_version=weight_version, seed=seed, n_threads=n_threads, model_path=model_path,
                  name=name)


def create_engine_from_config(model_path: str, config, *, weight_version: int = 0, seed: Optional[int] = None,
                              name: str = "engine") -> Engine:
    """`create_engine` from a `NativeEngineConfig`."""
    return create_engine(model_path, kind=config.kind, max_running_requests=config.max_running_requests,
                         context_length=config.context_length, dtype=config.dtype, n_threads=config.n_threads,
                         seed=config.seed if seed is None else seed, weight_version=weight_version, name=name,
                         attention=config.decode_attention)
