"""The native inference engine: continuous batching over a model runner, driven by one thread.

One engine thread runs the loop; every other thread talks to it through a request queue and a
command queue and gets `concurrent.futures.Future`s back (`asyncio.wrap_future` makes them
awaitable). One turn of the loop:

    1. apply commands          pause / continue / abort a rid / swap weights / flush
    2. admit waiting requests  prefill them into free slots n..n+b-1, sample their first token
    3. decode                  one token for every running slot 0..n-1, sampled in one batch
    4. retire finished ones    resolve their futures, move the last slots into the holes

so new requests join between decode steps and finished ones leave at once. Running requests
always occupy slots 0..n-1, and their per-slot state lives in tensors indexed by slot
(`realhf.impl.inference.slots`), so a decode step is a fixed number of tensor ops whatever n is.

Per-token log-probs are those of `realhf.impl.inference.sampling` (log_softmax(logits / T) at the
sampled token; greedy: T treated as 1).

Weight versions: a weight swap happens between decode steps. Requests still running when new
weights land are returned with `abort` and their partial output first (all of it produced by the
old weights), so each response carries exactly one `weight_version`. The GserverManager pauses
servers before updating them anyway, so normally nothing is running at that moment.

Device: the engine runs where its runner's weights are (`runner.device`, one device chosen by
`realhf.base.device.pick_device` where the server is built). The slots' state, the sampler's
generator and every tensor a step creates live there; token ids and log-probs reach the host only
when requests finish, batched per step.

The model behind the engine is a runner (`realhf.impl.inference.runners.ModelRunner`);
`realhf.impl.inference.factory.create_engine` builds both for a model directory. Requests and
results are the types of `realhf.impl.inference.request`.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

import torch

from realhf.base import logging
from realhf.impl.inference.request import (
    EngineClosedError,
    EngineStepError,
    GenerateRequest,
    GenerateResult,
    abort_reason,
    check_new_rids,
    check_request,
)
from realhf.impl.inference.runners import ModelRunner
from realhf.impl.inference.slots import SlotState

logger = logging.getLogger("engine")

# Prompts per prefill forward. Chunks of similar-length prompts pad little; 16 prompts of ~32
# tokens still make matmuls big enough to run at full speed (256 bench prompts: 0.85 s in
# chunks of 64, 0.70 s in chunks of 16).
_PREFILL_CHUNK = 16
# Steps in a row that may fail (each failing only its own requests) before the engine counts as
# broken and closes (every later request 503, the manager routes around it, the launcher restarts it).
_MAX_FAILED_STEPS_IN_A_ROW = 3


@dataclass
class _Req:
    req: GenerateRequest
    future: Future
    t_submit: float
    stop_ids: List[int]  # EOS (unless ignore_eos) + stop_token_ids
    seen: List[int] = field(default_factory=list)  # the output so far, kept only for a stop_check
    # (first output token index, weight version) from admission on: more than one entry when
    # the weights changed under a running request (keep_running_on_update)
    versions: List[Tuple[int, int]] = field(default_factory=list)


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


def _changes(versions: List[Tuple[int, int]], n_ids: int) -> Optional[List[Tuple[int, int]]]:
    """The (first token index, version) marks that matter for `n_ids` output tokens: None when
    every token came from one version."""
    marks = [(i, v) for i, v in versions if i < n_ids]
    return marks if len({v for _, v in marks}) > 1 else None


class Engine:
    """Continuous batching over a ModelRunner, driven by one engine thread.

    Thread-safe: `submit`, `pause`, `resume`, `abort`, `abort_all`, `flush_cache` return
    Futures; `update_weights` blocks its caller (it loads the checkpoint in the caller's thread,
    so decoding goes on meanwhile) until the swap happened.
    """

    def __init__(
        self,
        runner: ModelRunner,
        *,
        weight_version: int = 0,
        seed: int = 1,
        n_threads: int = 1,
        model_path: str = "",
        max_prefill_tokens: int = 16384,
        name: str = "engine",
        keep_running_on_update: bool = False,
    ):
        self.runner = runner
        self.model_path = model_path
        self.weight_version = int(weight_version)
        self.n_threads = n_threads
        self.max_prefill_tokens = max_prefill_tokens
        self.name = name
        # A weight swap keeps the running requests (their KV cache, computed with the old
        # weights) and decodes on with the new ones, each token tagged with its version,
        # instead of returning them aborted with their partial output.
        self.keep_running_on_update = keep_running_on_update
        torch.set_num_threads(n_threads)
        self.device = runner.device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)

        self.vocab_size, self.context_len, self.n_slots = runner.vocab_size, runner.context_len, runner.n_slots
        self.slots = SlotState(self.n_slots, self.context_len, self.vocab_size, self.device)
        self.slot_req: List[_Req] = []  # the request in each running slot 0..n_active-1

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
        self.prefill_shared_total = 0  # admitted prompts whose prefill was another slot's (identical prompt)
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.aborted_total = 0
        self.failed_steps_total = 0
        self._admitting: List[_Req] = []  # taken from the queue, not yet in a slot
        self._n_watched = 0  # live requests with on_token or stop_check: a step looks at tokens on the host only then
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
        return self.submit_many([req])[0]

    def submit_many(self, reqs: List[GenerateRequest]) -> List[Future]:
        """Queue requests together, all or none (ValueError naming the first bad one): they reach
        the same admission, so identical prompts among them (the `n` samples of a prompt) are
        prefilled once."""
        queued = []
        for req in reqs:
            err = self.check_request(req)
            if err:
                raise ValueError(err)
            if not req.rid:
                req.rid = uuid.uuid4().hex
            s = req.sampling
            stop = list(dict.fromkeys(list(s.stop_token_ids) + ([] if s.ignore_eos else self.runner.eos_token_ids)))
            queued.append(_Req(req, Future(), time.monotonic(), stop))
        rids = [r.req.rid for r in queued]
        with self._live_lock:
            self._raise_if_closed()
            check_new_rids(rids, self._live)
            for r in queued:
                self._live[r.req.rid] = r
            self._n_watched += sum(r.req.watched for r in queued)
            # Under the lock (stop() cannot miss them when draining), in one deque call (the
            # engine thread sees all of them or none).
            self._waiting.extend(queued)
        self._wake.set()
        return [r.future for r in queued]

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
        return self._swap_in(lambda: self.runner.load_weights(model_path), weight_version, model_path, timeout)

    def update_weights_from_state(
        self, state: Dict[str, Any], weight_version: Optional[int], source: str, timeout: float = 300.0
    ) -> int:
        """As `update_weights`, from tensors under HF names (a broadcast's); the model path stays."""
        return self._swap_in(lambda: self.runner.weights_from_state(state), weight_version, None, timeout, source)

    def _swap_in(
        self,
        load: Callable[[], Any],
        weight_version: Optional[int],
        model_path: Optional[str],
        timeout: float,
        source: str = "",
    ) -> int:
        t0 = time.monotonic()
        weights = load()
        t_load = time.monotonic() - t0

        def swap():
            old = self.weight_version
            new = old + 1 if weight_version is None else int(weight_version)
            if self.keep_running_on_update:
                n_gen = self.slots.n_gen[: self.n_active].tolist()
                for r, done in zip(self.slot_req, n_gen):
                    r.versions.append((int(done), new))
                n_aborted = 0
            else:
                n_aborted = self._abort_running(f"weights updated to version {new}")
            self.runner.set_weights(weights)
            self.weight_version = new
            if model_path is not None:
                self.model_path = model_path
            logger.info(
                f"{self.name}: weights v{old} -> v{self.weight_version} from {model_path or source} "
                f"(load {t_load * 1e3:.0f} ms; {n_aborted} running requests aborted)"
            )
            return self.weight_version

        return self._post(swap).result(timeout=timeout)

    def stats(self) -> EngineStats:
        n = self.n_active
        used = int(self.slots.seq_len[:n].sum()) if n else 0
        t0, tok0 = self._tput_mark
        elapsed = time.monotonic() - t0
        # The loop refreshes the rate while decoding; an idle engine decays it here.
        tput = self._tput if elapsed < 5.0 else (self.generation_tokens_total - tok0) / elapsed
        return EngineStats(
            running=n,
            queued=len(self._waiting),
            paused=self._paused,
            weight_version=self.weight_version,
            n_slots=self.n_slots,
            context_len=self.context_len,
            token_usage=used / float(self.n_slots * self.context_len),
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_total=self.requests_total,
            aborted_total=self.aborted_total,
            gen_throughput=tput,
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
                self._finish(r, [], [], abort_reason(reason))
            self.slot_req.clear()
        while self._waiting:
            self._finish_queued(self._waiting.popleft(), reason)

    # ---- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        torch.set_num_threads(self.n_threads)  # the OpenMP setting is per thread
        failed_in_a_row = 0
        try:
            while not self._stopping:
                self._wake.clear()
                self._apply_commands()
                busy = False
                try:
                    if not self._paused and self._waiting and self.n_active < self.n_slots:
                        busy = True
                        self._admit()
                    if self.n_active:
                        busy = True
                        self._decode_step()
                        self._maybe_log()
                    if busy:  # an idle pass proves nothing about the next step
                        failed_in_a_row = 0
                except Exception as e:
                    # One bad step (a request the checks let through, a transient fault) fails the
                    # requests in it, not the server; a step that keeps failing is a broken engine.
                    failed_in_a_row += 1
                    if failed_in_a_row >= _MAX_FAILED_STEPS_IN_A_ROW:
                        raise
                    self._fail_step(e)
                    continue
                if not busy and not self._commands and (self._paused or not self._waiting):
                    self._wake.wait(0.5)
        except BaseException as e:  # a bug: fail every pending request instead of hanging them
            logger.exception(f"{self.name}: engine loop failed: {e}")
            self._error = e
            with self._live_lock:
                self._closed = True
            self._drain(f"engine failed: {e!r}")

    def _fail_step(self, e: Exception) -> None:
        """Fail every request of the failed step (running, or being admitted) with
        EngineStepError and start from empty slots: their state may be half-written."""
        failed = self.slot_req + [r for r in self._admitting if r not in self.slot_req]
        logger.exception(f"{self.name}: a step failed; failing its {len(failed)} requests and serving on: {e!r}")
        self.failed_steps_total += 1
        error = EngineStepError(f"{self.name}: the engine step serving this request failed: {e!r}")
        for r in failed:
            with self._live_lock:
                self._live.pop(r.req.rid, None)
                self._n_watched -= r.req.watched
            self.requests_total += 1
            if not r.future.done():
                r.future.set_exception(error)
        self.slot_req = []
        self._admitting = []
        self.slots = SlotState(self.n_slots, self.context_len, self.vocab_size, self.device)

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
                self._retire([slot], [abort_reason("aborted by request")])
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

    def _abort_running(self, message: str) -> int:
        n = self.n_active
        if n:
            self._retire(list(range(n)), [abort_reason(message)] * n)
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
        # prompt of the whole batch would waste up to a third of the prefill compute. Identical
        # prompts end up side by side.
        batch.sort(key=lambda r: (len(r.req.input_ids), r.req.input_ids))
        lo, b = self.n_active, len(batch)
        hi = lo + b
        prompt_lens = [len(r.req.input_ids) for r in batch]
        self._admitting = batch  # a failure before they hold slots must still fail them
        self.slots.fill(lo, [r.req.sampling for r in batch], prompt_lens, [r.stop_ids for r in batch])
        for r in batch:
            r.versions = [(0, self.weight_version)]
        self.slot_req.extend(batch)
        self._admitting = []
        self.prompt_tokens_total += sum(prompt_lens)

        # The samples of a prompt group arrive as identical prompts: each distinct prompt is
        # prefilled once and its keys and values copied to the other slots (they then sample
        # independently from the same logits).
        first: Dict[Tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(r.req.input_ids), i) for i, r in enumerate(batch)]  # [b] row to share
        unique = list(first.values())
        parts = []
        for c0 in range(0, len(unique), _PREFILL_CHUNK):
            rows = unique[c0 : c0 + _PREFILL_CHUNK]
            longest = max(prompt_lens[i] for i in rows)
            # Right-padded: one tensor (one copy to a GPU) per chunk.
            tokens = torch.tensor(
                [batch[i].req.input_ids + [0] * (longest - prompt_lens[i]) for i in rows],
                dtype=torch.long,
                device=self.device,
            )  # [c, longest]
            slots = torch.tensor([lo + i for i in rows], device=self.device)  # [c]
            lengths = torch.tensor([prompt_lens[i] for i in rows], device=self.device)  # [c]
            parts.append(self.runner.prefill(slots, tokens, lengths))
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)  # [u, vocab]
        copies = [i for i, src in enumerate(source) if src != i]
        if copies:
            self.runner.move_slots(
                torch.tensor([lo + source[i] for i in copies], device=self.device),
                torch.tensor([lo + i for i in copies], device=self.device),
                max(prompt_lens[i] for i in copies),
            )
            at = {row: k for k, row in enumerate(unique)}
            logits = logits[torch.tensor([at[src] for src in source], device=self.device)]  # [b, vocab]
        self.prefill_shared_total += len(copies)
        self._sample_append_retire(logits, lo, hi)

    # ---- one decode step ------------------------------------------------------------------------
    def _decode_step(self) -> None:
        n = self.n_active
        logits = self.runner.decode(self.slots.last_tok[:n], self.slots.seq_len[:n] - 1)  # [n, vocab]
        self._sample_append_retire(logits, 0, n)

    def _sample_append_retire(self, logits: torch.Tensor, lo: int, hi: int) -> None:
        """Sample one token for rows lo..hi-1 from their logits, append it, retire finished rows."""
        finished, reasons = self.slots.sample_append(logits, lo, hi, self.generator)
        self.generation_tokens_total += hi - lo
        if self._n_watched:
            self._watch_tokens(lo, hi, finished, reasons)
        if finished:
            self._retire(finished, reasons)

    def _watch_tokens(self, lo: int, hi: int, finished: List[int], reasons: List[Dict[str, Any]]) -> None:
        """The token just sampled by each watched row in lo..hi-1 (one transfer to the host for
        all of them, only on steps that have such rows): a row whose stop_check matches joins
        `finished` (with its reason in `reasons`); the others hand it to their on_token. A row
        that finishes is not streamed: its last token comes with its result."""
        rows = [i for i in range(lo, hi) if self.slot_req[i].req.watched]
        if not rows:
            return
        idx = torch.tensor(rows, device=self.device)  # [k]
        tokens = self.slots.last_tok[idx].tolist()
        logprobs = self.slots.out_lp[idx, self.slots.n_gen[idx] - 1].tolist()
        done = set(finished)
        for i, tok, lp in zip(rows, tokens, logprobs):
            r = self.slot_req[i]
            try:
                if r.req.stop_check is not None:
                    r.seen.append(tok)
                    matched = None if i in done else r.req.stop_check(r.seen)
                    if matched is not None:
                        finished.append(i)
                        reasons.append({"type": "stop", "matched": matched})
                        done.add(i)
                if r.req.on_token is not None and i not in done:
                    r.req.on_token(tok, lp)
            except Exception as e:  # a consumer's bug must not fail the step of everyone else
                logger.warning(f"{self.name}: the token callback of {r.req.rid!r} raised {e!r}")

    # ---- leaving --------------------------------------------------------------------------------
    def _retire(self, slots: List[int], reasons: List[Dict[str, Any]]) -> None:
        """Resolve the requests in `slots` and compact the running rows to 0..n'-1."""
        leaving = [self.slot_req[slot] for slot in slots]
        outputs = self.slots.release(slots, [r.req.sampling for r in leaving])
        for r, (ids, lps), reason in zip(leaving, outputs, reasons):
            self._finish(r, ids, lps, reason)
        n = self.n_active
        keep = n - len(slots)
        gone = set(slots)
        holes = [s for s in sorted(gone) if s < keep]
        movers = [s for s in range(keep, n) if s not in gone]
        if holes:
            src = torch.tensor(movers, device=self.device)  # [m]
            dst = torch.tensor(holes, device=self.device)  # [m]
            self.runner.move_slots(src, dst, int(self.slots.seq_len[src].max()))
            self.slots.move(src, dst)
            for h, m in zip(holes, movers):
                self.slot_req[h] = self.slot_req[m]
        del self.slot_req[keep:]

    def _finish_queued(self, r: _Req, message: str) -> None:
        self._finish(r, [], [], abort_reason(message))

    def _finish(self, r: _Req, ids: List[int], lps: List[float], reason: Dict[str, Any]) -> None:
        with self._live_lock:
            self._live.pop(r.req.rid, None)
            self._n_watched -= r.req.watched
        self.requests_total += 1
        self.aborted_total += reason["type"] == "abort"
        result = GenerateResult(
            rid=r.req.rid,
            output_ids=ids,
            output_logprobs=lps,
            finish_reason=reason,
            prompt_tokens=len(r.req.input_ids),
            weight_version=self.weight_version,
            e2e_latency=time.monotonic() - r.t_submit,
            weight_version_changes=_changes(r.versions, len(ids)),
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
            logger.info(
                f"{self.name}: running={self.n_active} queued={len(self._waiting)} "
                f"version={self.weight_version} gen={self._tput:.0f} tok/s "
                f"total_tokens={self.generation_tokens_total} requests={self.requests_total}"
            )
