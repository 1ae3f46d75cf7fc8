"""The `vllm` backend's engine: the native engine's surface over vLLM's `AsyncLLM` (issue 46).

`realhf.system.gen_server.server_app` speaks SGLang's protocol in front of an engine; this class gives
it vLLM instead of the built-in engine, so the server that the manager and the rollout workers
talk to is the same program whichever engine generates (one code path for routing, health
checks, staleness, weight versions, aborts and restarts). vLLM is imported only here and only
in the process that serves it: `realhf.launch_vllm_server`, started from vLLM's own
environment (its pins clash with the project's: docs/architecture.md §5).

    submit_many   each request becomes one vLLM request (its `n` samples were already split by
                  the HTTP layer, prompt-major, as for the built-in engine), token ids in, sampled
                  ids and their log-probs out as deltas, every delta stamped with the weight
                  version current when it arrived
    pause/resume  vLLM's pause_generation(mode="abort"): running and queued requests end with
                  `abort` and their partial output; new ones wait for resume
    update_weights  pause, `reload_weights` in vLLM's workers from an HF directory (collective
                  RPC), reset the prefix cache, new version, resume. Requests running at that
                  moment end with `abort` and their partial output (the client resumes them, as
                  with the built-in engine); the manager pauses servers before updating anyway
    update_weights_from_state  the same from tensors (a weight broadcast's), sent to vLLM's
                  workers through the same RPC

Log-probs: vLLM runs with `logprobs_mode="processed_logprobs"`, the log-softmax after
temperature (and top-k/top-p, off in training), which is what the built-in engine and the
trainer compute; vLLM's default (`raw_logprobs`) ignores the temperature.

One asyncio loop on a thread of its own drives AsyncLLM; every public method may be called from
any thread and returns a `concurrent.futures.Future` where the native engine does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from realhf.api.cli_args import VLLMConfig
from realhf.base import logging
from realhf.impl.inference.engine import EngineStats
from realhf.impl.inference.request import (
    EngineClosedError,
    EngineStepError,
    GenerateRequest,
    GenerateResult,
    abort_reason,
    check_new_rids,
    check_request,
)

logger = logging.getLogger("vllm_engine")

_ABORT_DRAIN_TIMEOUT = 30.0  # seconds for requests aborted by a pause to hand back their output


def model_limits(model_path: str) -> Tuple[int, int]:
    """(vocab_size, max_position_embeddings) from the HF config, to check requests before vLLM
    sees them (the same checks and messages as the built-in engine)."""
    with open(os.path.join(model_path, "config.json")) as f:
        cfg = json.load(f)
    text = cfg.get("text_config", cfg)
    return int(text["vocab_size"]), int(text.get("max_position_embeddings", 2048))


# On a CPU, the KV cache realhf asks for when gen_server.vllm.kv_cache_gib is 0: enough for
# max_num_seqs requests of full length, within these bounds.
CPU_KV_MIN_BYTES, CPU_KV_MAX_BYTES = 64 * 2**20, 4 * 2**30
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_cache_bytes(model_path: str, cfg: VLLMConfig, context_len: int, on_cpu: bool) -> Optional[int]:
    """The KV cache to give vLLM, in bytes; None: vLLM's own sizing (on a GPU, what
    gpu_memory_utilization leaves). On a CPU vLLM otherwise reserves gpu_memory_utilization of the
    host's memory and refuses to start when less than that is free (a trainer shares the host)."""
    if cfg.kv_cache_gib > 0:
        return int(cfg.kv_cache_gib * 2**30)
    if not on_cpu:
        return None
    with open(os.path.join(model_path, "config.json")) as f:
        hf = json.load(f)
    hf = hf.get("text_config", hf)
    heads = int(hf["num_attention_heads"])
    head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // heads)
    dtype = cfg.dtype if cfg.dtype != "auto" else str(hf.get("torch_dtype") or hf.get("dtype") or "float32")
    per_token = 2 * int(hf["num_hidden_layers"]) * int(hf.get("num_key_value_heads", heads)) * head_dim
    need = cfg.max_num_seqs * context_len * per_token * _DTYPE_BYTES.get(dtype, 4)
    return min(max(need, CPU_KV_MIN_BYTES), CPU_KV_MAX_BYTES)


def build_engine_args(
    model_path: str,
    cfg: VLLMConfig,
    context_len: int,
    seed: int,
    gpu_share: float = 1.0,
    kv_bytes: Optional[int] = None,
):
    """vLLM's AsyncEngineArgs for realhf's VLLMConfig; every other argument stays vLLM's default."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(
        model=model_path,
        dtype=cfg.dtype,
        max_model_len=context_len,
        max_num_seqs=cfg.max_num_seqs,
        enforce_eager=cfg.enforce_eager,
        gpu_memory_utilization=cfg.gpu_memory_utilization * gpu_share,
        kv_cache_memory_bytes=kv_bytes,
        enable_prefix_caching=cfg.enable_prefix_caching,
        seed=seed,
        skip_tokenizer_init=True,  # token ids in and out; the HTTP layer has the tokenizer
        logprobs_mode="processed_logprobs",
        disable_log_stats=True,
        worker_extension_cls="realhf.impl.inference.vllm_worker.WorkerExtension",
    )


def _async_llm(engine_args):
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(engine_args)


def _sampling_params(**kw):
    """vLLM's SamplingParams, its outputs as deltas (each token once, stamped on arrival)."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(**kw, output_kind=RequestOutputKind.DELTA)


def sampling_kwargs(req: GenerateRequest) -> Dict[str, Any]:
    """vLLM's sampling arguments for a request of realhf's (SGLang's names): one sample, token
    ids only, the sampled token's log-prob."""
    s = req.sampling
    return dict(
        n=1,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=0 if s.top_k == -1 else s.top_k,  # vLLM's "off" is 0
        min_tokens=s.min_new_tokens,
        max_tokens=s.max_new_tokens,
        stop_token_ids=list(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,
    )


@contextlib.contextmanager
def _snapshot(path: str):
    """A private copy of the checkpoint's files (in shared memory where there is some), removed
    after use. The trainer prunes old versions while servers load them; vLLM reading a folder that
    vanishes halfway leaves its model half loaded, a copy that fails leaves it untouched."""
    import shutil
    import tempfile

    names = [n for n in (os.listdir(path) if os.path.isdir(path) else []) if n.endswith((".safetensors", ".json"))]
    if not any(n.endswith(".safetensors") for n in names):
        raise FileNotFoundError(f"{path} is not a folder with *.safetensors files (pruned, or never written)")
    where = tempfile.mkdtemp(prefix="realhf-vllm-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        for n in names:
            shutil.copyfile(os.path.join(path, n), os.path.join(where, n))
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


class _Live:
    """One request in flight: what it produced so far."""

    __slots__ = ("req", "future", "t0", "ids", "logprobs", "marks", "task", "aborted")

    def __init__(self, req: GenerateRequest, future: Future):
        self.req, self.future, self.t0 = req, future, time.monotonic()
        self.ids: List[int] = []
        self.logprobs: List[float] = []
        self.marks: List[Tuple[int, int]] = []  # (first output index, version)
        self.task: Optional[asyncio.Task] = None
        # Set by an abort: one that reaches vLLM before this request does is a no-op there, so
        # _drive ends a request aborted before it started, and aborts again once vLLM has it.
        self.aborted = False


def _ended_aborted(fut: Future) -> bool:
    return fut.done() and fut.exception() is None and fut.result().finish_reason["type"] == "abort"


class VLLMEngine:
    """The native `Engine`'s public surface, served by vLLM (see the module docstring)."""

    def __init__(
        self,
        model_path: str,
        cfg: VLLMConfig,
        *,
        weight_version: int = 0,
        seed: int = 1,
        gpu_share: float = 1.0,
        name: str = "vllm",
        llm_factory: Optional[Callable[[], Any]] = None,
        sampling_factory: Optional[Callable[..., Any]] = None,
    ):
        self.model_path = model_path
        self._served_config_path = model_path  # the architecture every update must keep
        self.name = name
        self.weight_version = int(weight_version)
        self.vocab_size, max_pos = model_limits(model_path)
        self.context_len = cfg.context_length or max_pos
        self.n_slots = cfg.max_num_seqs
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._cfg = cfg
        self.kv_bytes = kv_cache_bytes(model_path, cfg, self.context_len, self.device.type == "cpu")
        # Unit tests hand in stand-ins for AsyncLLM and SamplingParams; the real AsyncLLM is built
        # on the loop thread (it starts its output handler on the running loop).
        self._llm_factory = llm_factory or (
            lambda: _async_llm(build_engine_args(model_path, cfg, self.context_len, seed, gpu_share, self.kv_bytes))
        )
        self._sampling_factory = sampling_factory or _sampling_params
        self._llm = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._live: Dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._error: Optional[BaseException] = None
        self._paused = False
        self._update_lock: Optional[asyncio.Lock] = None
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.aborted_total = 0
        self._tput_mark = (time.monotonic(), 0)
        self._tput = 0.0

    # ---- life -----------------------------------------------------------------------------------
    def start(self, timeout: float = 600.0) -> "VLLMEngine":
        """Start the loop thread and build vLLM's engine on it (loads the model; raises what
        vLLM raised, or TimeoutError naming the model after `timeout` s)."""
        if self._thread is not None:
            return self
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"{self.name}-loop", daemon=True)
        self._thread.start()

        async def build():
            self._update_lock = asyncio.Lock()
            self._llm = self._llm_factory()

        t0 = time.monotonic()
        try:
            asyncio.run_coroutine_threadsafe(build(), self._loop).result(timeout=timeout)
        except TimeoutError:
            raise TimeoutError(f"{self.name}: vLLM did not load {self.model_path} within {timeout:.0f}s") from None
        logger.info(
            f"{self.name}: vLLM engine for {self.model_path} in {time.monotonic() - t0:.1f}s "
            f"({self._cfg.max_num_seqs} sequences x {self.context_len} tokens, dtype {self._cfg.dtype}, "
            f"KV cache {'sized by vLLM' if self.kv_bytes is None else f'{self.kv_bytes / 2**30:.2f} GiB'}, "
            f"on {self.device}), weight version {self.weight_version}"
        )
        return self

    def is_alive(self) -> bool:
        if self._thread is None or not self._thread.is_alive() or self._error is not None:
            return False
        return not getattr(self._llm, "errored", False)

    def stop(self, timeout: float = 10.0) -> None:
        """Every queued or running request ends with `abort`; vLLM's engine process is shut down.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._loop is None:
            return
        try:
            self._run(self._abort_rids(list(self._live)), timeout)
        except Exception as e:  # noqa: BLE001 - shutting down: report, go on
            logger.warning(f"{self.name}: aborting requests at stop failed: {e!r}")
        if self._llm is not None:
            self._llm.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=timeout)

    # ---- requests -------------------------------------------------------------------------------
    def check_request(self, req: GenerateRequest) -> Optional[str]:
        return check_request(req, self.vocab_size, self.context_len)

    def submit(self, req: GenerateRequest) -> Future:
        return self.submit_many([req])[0]

    def submit_many(self, reqs: List[GenerateRequest]) -> List[Future]:
        """Queue requests, all or none (ValueError naming the first bad one or a rid in use)."""
        import uuid

        for req in reqs:
            err = self.check_request(req)
            if err:
                raise ValueError(err)
            if not req.rid:
                req.rid = uuid.uuid4().hex
        rids = [r.rid for r in reqs]
        live = [_Live(r, Future()) for r in reqs]
        with self._lock:
            self._raise_if_closed()
            check_new_rids(rids, self._live)
            for item in live:
                self._live[item.req.rid] = item
        for item in live:
            self._loop.call_soon_threadsafe(self._start_task, item)
        return [item.future for item in live]

    def _start_task(self, item: _Live) -> None:
        item.task = self._loop.create_task(self._drive(item))

    async def _drive(self, item: _Live) -> None:
        req = item.req
        finish: Dict[str, Any] = {"type": "abort", "message": "ended without a final output"}
        try:
            if item.aborted:
                finish = abort_reason("aborted before it started")
            elif req.sampling.max_new_tokens == 0:
                finish = {"type": "length", "length": 0}
            else:
                prompt = {"prompt_token_ids": list(req.input_ids)}
                async for out in self._llm.generate(
                    prompt, self._sampling_factory(**sampling_kwargs(req)), request_id=req.rid
                ):
                    c = out.outputs[0]
                    matched = self._take(item, list(c.token_ids), c.logprobs, out.finished)
                    if matched is not None:  # a stop string: the answer ends at its token
                        finish = {"type": "stop", "matched": matched}
                        if not out.finished:
                            await self._llm.abort([req.rid])
                        break
                    if out.finished:
                        finish = self._finish_reason(c, len(item.ids))
                    elif item.aborted:  # the abort may have reached vLLM before this request
                        await self._llm.abort([req.rid])
        except asyncio.CancelledError:
            finish = abort_reason("server shutting down")
        except Exception as e:  # noqa: BLE001 - the request fails, the engine may serve on
            dead = type(e).__name__ == "EngineDeadError" or getattr(self._llm, "errored", False)
            if dead and self._error is None:
                self._error = e  # /health answers 503 from now on: the worker exits and is restarted
            self._settle(item, error=(EngineClosedError if dead else EngineStepError)(f"{self.name}: {e!r}"))
            return
        self._settle(item, finish=finish)

    def _take(self, item: _Live, ids: List[int], logprobs, finished: bool = False) -> Optional[str]:
        """Append an output's new tokens, token by token: the stop string a token completes (the
        answer then ends there, the tokens after it dropped), else None. Each token but the
        answer's last goes to on_token as it is taken."""
        if not ids:
            return None
        if not item.marks or item.marks[-1][1] != self.weight_version:
            item.marks.append((len(item.ids), self.weight_version))
        check, on_token = item.req.stop_check, item.req.on_token
        for k, (t, d) in enumerate(zip(ids, logprobs)):
            lp = float(d[t].logprob)
            item.ids.append(t)
            item.logprobs.append(lp)
            self.generation_tokens_total += 1
            last = finished and k == len(ids) - 1  # ended by vLLM: length or a stop token first
            matched = None if check is None or last else check(item.ids)
            if on_token is not None and not last and matched is None:
                on_token(t, lp)
            if matched is not None:
                return matched
        return None

    def _finish_reason(self, c, n: int) -> Dict[str, Any]:
        """SGLang's finish_reason from vLLM's: stop (with the matched token), length, abort."""
        if c.finish_reason == "stop":
            matched = c.stop_reason if isinstance(c.stop_reason, int) else (c.token_ids[-1] if c.token_ids else None)
            return {"type": "stop", "matched": matched}
        if c.finish_reason == "length":
            return {"type": "length", "length": n}
        return abort_reason(str(c.stop_reason or "aborted"))

    def _settle(self, item: _Live, finish: Optional[Dict[str, Any]] = None, error: Optional[Exception] = None):
        with self._lock:
            self._live.pop(item.req.rid, None)
        if item.future.done():
            return
        if error is not None:
            item.future.set_exception(error)
            return
        self.requests_total += 1
        self.prompt_tokens_total += len(item.req.input_ids)
        self.aborted_total += finish["type"] == "abort"
        marks = item.marks or [(0, self.weight_version)]
        item.future.set_result(
            GenerateResult(
                rid=item.req.rid,
                output_ids=item.ids,
                output_logprobs=item.logprobs,
                finish_reason=finish,
                prompt_tokens=len(item.req.input_ids),
                weight_version=marks[0][1],
                e2e_latency=time.monotonic() - item.t0,
                weight_version_changes=marks if len({v for _, v in marks}) > 1 else None,
            )
        )

    # ---- commands ---------------------------------------------------------------------------------
    def _raise_if_closed(self) -> None:
        if self._error is not None:
            raise EngineClosedError(f"{self.name}: vLLM engine failed: {self._error!r}")
        if self._closed:
            raise EngineClosedError(f"{self.name}: engine is stopped")

    def _post(self, coro) -> Future:
        self._raise_if_closed()
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    async def _abort_rids(self, rids: List[str]) -> int:
        """Abort these requests; how many of them ended with `abort`. Not all that were found:
        one whose last output vLLM had made before the abort reached it ends as it was."""
        items = [self._live[r] for r in rids if r in self._live]
        for item in items:
            item.aborted = True
        if items:
            await self._llm.abort([i.req.rid for i in items])
            await self._drained(items)
        return sum(_ended_aborted(i.future) for i in items)

    async def _drained(self, items: List[_Live]) -> None:
        """Wait until aborted requests handed back their last output (their tasks ended)."""
        tasks = [i.task for i in items if i.task is not None and not i.task.done()]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=_ABORT_DRAIN_TIMEOUT)
            if pending:
                logger.warning(
                    f"{self.name}: {len(pending)} aborted requests did not end within {_ABORT_DRAIN_TIMEOUT:.0f}s"
                )

    def pause(self) -> Future:
        """Running and queued requests end now with `abort` and their partial output; new ones
        wait for resume."""

        async def pause():
            items = list(self._live.values())
            await self._llm.pause_generation(mode="abort", clear_cache=False)
            self._paused = True
            await self._drained(items)
            return len(items)

        return self._post(pause())

    def resume(self) -> Future:
        async def resume():
            await self._llm.resume_generation()
            self._paused = False
            return True

        return self._post(resume())

    def abort(self, rid: str) -> Future:
        async def abort():
            return bool(await self._abort_rids([rid]))

        return self._post(abort())

    def abort_all(self) -> Future:
        async def abort_all():
            return await self._abort_rids(list(self._live))

        return self._post(abort_all())

    def flush_cache(self) -> Future:
        async def flush():
            await self._llm.reset_prefix_cache()
            return True

        return self._post(flush())

    def update_weights(self, model_path: str, weight_version: Optional[int] = None, timeout: float = 300.0) -> int:
        """Load `model_path` (an HF directory) into vLLM's workers in place; return the new version
        (default: current + 1). Raises what the load raised; the engine resumes either way."""
        with _snapshot(model_path) as local:
            self._check_checkpoint(local, model_path)
            return self._run(self._swap({"weights_path": local}, weight_version, model_path, model_path), timeout + 5.0)

    # The config fields a checkpoint must share with the served model to be loaded in place.
    _SHAPE_FIELDS = (
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
    )

    def _check_checkpoint(self, path: str, named: str) -> None:
        """Refuse, before vLLM sees it, a checkpoint vLLM cannot load in place (`named`: where it
        came from): an error inside vLLM's reload leaves its model half loaded, and the next
        step kills its engine (the built-in engine keeps its old weights instead)."""
        try:
            with open(os.path.join(path, "config.json")) as f:
                new = json.load(f)
            with open(os.path.join(self._served_config_path, "config.json")) as f:
                served = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{named}: cannot read its config.json or the served model's: {e}") from None
        differ = [k for k in self._SHAPE_FIELDS if new.get(k) != served.get(k)]
        if differ:
            shown = ", ".join(f"{k} {new.get(k)!r} (served: {served.get(k)!r})" for k in differ)
            raise ValueError(f"{named} is not the served model's architecture: {shown}")

    def update_weights_from_state(
        self, state: Dict[str, Any], weight_version: Optional[int], source: str, timeout: float = 300.0
    ) -> int:
        """As `update_weights`, from tensors under HF names: written to a safetensors file in
        shared memory and loaded from there (vLLM's RPC to its workers does not carry tensors)."""
        import shutil
        import tempfile

        from safetensors.torch import save_file

        where = tempfile.mkdtemp(prefix="realhf-vllm-weights-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
            save_file(tensors, os.path.join(where, "model.safetensors"))
            return self._run(self._swap({"weights_path": where}, weight_version, None, source), timeout + 5.0)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    async def _swap(self, load: Dict[str, Any], weight_version: Optional[int], model_path, source: str) -> int:
        async with self._update_lock:
            t0 = time.monotonic()
            was_paused = self._paused
            items = list(self._live.values())
            if not was_paused:
                await self._llm.pause_generation(mode="abort", clear_cache=True)
                await self._drained(items)
            t_pause = time.monotonic() - t0
            old = self.weight_version
            try:
                await self._llm.collective_rpc("reload_weights", kwargs=load)
                # The prefix cache holds keys and values computed by the old weights.
                await self._llm.reset_prefix_cache()
                self.weight_version = old + 1 if weight_version is None else int(weight_version)
                if model_path is not None:
                    self.model_path = model_path
            finally:
                if not was_paused:
                    await self._llm.resume_generation()
            logger.info(
                f"{self.name}: weights v{old} -> v{self.weight_version} from {source} in "
                f"{time.monotonic() - t0:.2f}s (pause {t_pause:.2f}s; "
                f"{0 if was_paused else len(items)} running requests aborted)"
            )
            return self.weight_version

    def stats(self) -> EngineStats:
        t0, tok0 = self._tput_mark
        now = time.monotonic()
        if now - t0 >= 5.0:
            self._tput = (self.generation_tokens_total - tok0) / (now - t0)
            self._tput_mark = (now, self.generation_tokens_total)
        return EngineStats(
            running=len(self._live),
            queued=0,  # vLLM's scheduler holds both; `running` counts every request in flight
            paused=self._paused,
            weight_version=self.weight_version,
            n_slots=self.n_slots,
            context_len=self.context_len,
            token_usage=0.0,  # vLLM's KV usage is not read here
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            requests_total=self.requests_total,
            aborted_total=self.aborted_total,
            gen_throughput=self._tput,
        )
