"""VLLMEngine's bookkeeping against an in-process stand-in for vLLM's AsyncLLM: token deltas into
results, versions stamped on arrival, aborts with partial output, pause/resume, weight updates
(pause, reload, prefix-cache reset, resume). The real vLLM: tests/system/engines/
(skipped where .venv-vllm is missing)."""

import asyncio
import json
import os
import time
from types import SimpleNamespace

import pytest

from realhf.api.cli_args import VLLMConfig
from realhf.impl.inference.request import GenerateRequest, SamplingParams
from realhf.impl.inference.vllm_engine import VLLMEngine, sampling_kwargs

MODEL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "assets", "tiny-math", "sft")
VOCAB = 258


class FakeAsyncLLM:
    """AsyncLLM's surface as VLLMEngine uses it: one token every `step_s`, token i of a request
    is (last prompt token + i + 1) % VOCAB with log-prob -0.1 * (i + 1)."""

    def __init__(self, step_s=0.002):
        self.step_s = step_s
        self.errored = False
        self.paused = False
        self.aborted = set()
        self.too_late = set()  # requests whose last token vLLM's engine core has made: an abort is a no-op
        self.running = set()
        self.calls = []

    @staticmethod
    def _out(ids, lps, finish=None, stop_reason=None):
        c = SimpleNamespace(
            token_ids=ids,
            logprobs=[{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, lps)],
            finish_reason=finish,
            stop_reason=stop_reason,
        )
        return SimpleNamespace(outputs=[c], finished=finish is not None)

    async def generate(self, prompt, params, request_id):
        ids = prompt["prompt_token_ids"]
        self.running.add(request_id)
        try:
            for i in range(params.max_tokens):
                while self.paused and request_id not in self.aborted:
                    await asyncio.sleep(self.step_s)
                await asyncio.sleep(self.step_s)
                if request_id in self.aborted:
                    yield self._out([], [], "abort")
                    return
                tok = (ids[-1] + i + 1) % VOCAB
                if tok in params.stop_token_ids:
                    yield self._out([tok], [-0.1 * (i + 1)], "stop", tok)
                    return
                last = i == params.max_tokens - 1
                yield self._out([tok], [-0.1 * (i + 1)], "length" if last else None)
        finally:
            self.running.discard(request_id)

    async def abort(self, request_ids):
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        self.aborted.update(r for r in ids if r not in self.too_late)

    async def pause_generation(self, mode="abort", clear_cache=True):
        self.calls.append(("pause", mode, clear_cache))
        self.paused = True
        if mode == "abort":
            self.aborted.update(self.running)

    async def resume_generation(self):
        self.calls.append(("resume",))
        self.paused = False

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        self.calls.append(("rpc", method, sorted(kwargs or {})))
        if os.path.exists(os.path.join((kwargs or {}).get("weights_path", ""), "BROKEN.json")):
            raise RuntimeError("no such checkpoint")

    async def reset_prefix_cache(self, *a):
        self.calls.append(("reset_prefix_cache",))
        return True

    def shutdown(self, timeout=None):
        self.calls.append(("shutdown",))


@pytest.fixture
def engine():
    fake = FakeAsyncLLM()
    eng = VLLMEngine(
        MODEL,
        VLLMConfig(context_length=256),
        weight_version=3,
        llm_factory=lambda: fake,
        sampling_factory=lambda **kw: SimpleNamespace(**kw),
    ).start()
    eng.fake = fake
    yield eng
    eng.stop()


def ckpt(tmp_path, name, broken=False, **config):
    """A checkpoint folder: the served model's config.json (with `config` changed) and a weights file."""
    import json
    import shutil

    path = tmp_path / name
    path.mkdir()
    cfg = json.loads(open(os.path.join(MODEL, "config.json")).read())
    (path / "config.json").write_text(json.dumps({**cfg, **config}))
    shutil.copyfile(os.path.join(MODEL, "model.safetensors"), path / "model.safetensors")
    if broken:
        (path / "BROKEN.json").write_text("{}")
    return str(path)


def req(rid, prompt=(5, 6, 7), n=4, **sampling):
    return GenerateRequest(input_ids=list(prompt), sampling=SamplingParams(max_new_tokens=n, **sampling), rid=rid)


def test_sampling_arguments_keep_sglang_meanings():
    kw = sampling_kwargs(req("a", n=9, temperature=0.7, top_k=-1, top_p=0.9, stop_token_ids=[2], min_new_tokens=1))
    assert kw == dict(
        n=1,
        temperature=0.7,
        top_p=0.9,
        top_k=0,
        min_tokens=1,
        max_tokens=9,
        stop_token_ids=[2],
        ignore_eos=False,
        logprobs=0,
        detokenize=False,
    )
    assert sampling_kwargs(req("b", top_k=5))["top_k"] == 5


def test_a_request_returns_its_tokens_logprobs_version_and_finish(engine):
    r = engine.submit(req("a", n=4)).result(timeout=10)
    assert r.output_ids == [8, 9, 10, 11]
    assert r.output_logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    assert r.finish_reason == {"type": "length", "length": 4}
    assert (r.weight_version, r.weight_version_changes, r.prompt_tokens) == (3, None, 3)
    stopped = engine.submit(req("b", n=10, stop_token_ids=[10])).result(timeout=10)
    assert stopped.output_ids == [8, 9, 10] and stopped.finish_reason == {"type": "stop", "matched": 10}
    empty = engine.submit(req("c", n=0)).result(timeout=10)
    assert empty.output_ids == [] and empty.finish_reason == {"type": "length", "length": 0}
    s = engine.stats()
    assert (s.requests_total, s.generation_tokens_total, s.running) == (3, 7, 0)


def test_streaming_callback_sees_every_token_once_but_the_last_which_comes_with_the_result(engine):
    seen = []
    r = req("s", n=5)
    r.on_token = lambda t, lp: seen.append((t, lp))
    out = engine.submit(r).result(timeout=10)
    assert [t for t, _ in seen] == out.output_ids[:-1] and len(seen) == 4


def test_bad_requests_are_refused_naming_the_field_and_rids_are_unique(engine):
    with pytest.raises(ValueError, match="input_ids contains token ids outside"):
        engine.submit(req("x", prompt=(VOCAB + 1,)))
    with pytest.raises(ValueError, match="exceeds the context length 256"):
        engine.submit(req("x", n=300))
    engine.fake.step_s = 0.05
    fut = engine.submit(req("dup", n=50))
    with pytest.raises(ValueError, match="'dup' is already queued or running"):
        engine.submit(req("dup"))
    assert engine.abort("dup").result(timeout=10) is True
    assert fut.result(timeout=10).finish_reason["type"] == "abort"


def test_abort_returns_the_partial_output(engine):
    engine.fake.step_s = 0.02
    fut = engine.submit(req("long", n=200))
    while engine.stats().generation_tokens_total < 3:
        time.sleep(0.01)
    assert engine.abort("long").result(timeout=10) is True
    r = fut.result(timeout=10)
    assert r.finish_reason["type"] == "abort" and 3 <= len(r.output_ids) < 200
    assert len(r.output_logprobs) == len(r.output_ids)
    assert engine.abort("nobody").result(timeout=10) is False


def test_an_abort_that_comes_after_the_last_token_was_made_says_it_aborted_nothing(engine):
    # The server logs the answer ("no such request ... ended already"): a client that reads its
    # stream behind the engine learns that the answer it holds one token of had ended.
    engine.fake.step_s = 0.05
    engine.fake.too_late.add("late")
    fut = engine.submit(req("late", n=5))
    assert engine.abort("late").result(timeout=10) is False
    r = fut.result(timeout=10)
    assert r.finish_reason == {"type": "length", "length": 5} and len(r.output_ids) == 5


def test_a_weight_update_aborts_running_requests_and_later_tokens_carry_the_new_version(engine, tmp_path):
    engine.fake.step_s = 0.02
    fut = engine.submit(req("old", n=200))
    while engine.stats().generation_tokens_total < 2:
        time.sleep(0.01)
    v7 = ckpt(tmp_path, "v7")
    assert engine.update_weights(v7, 7) == 7
    old = fut.result(timeout=10)
    assert old.finish_reason["type"] == "abort" and old.weight_version == 3 and old.weight_version_changes is None
    engine.fake.step_s = 0.001
    new = engine.submit(req("new", n=3)).result(timeout=10)
    assert new.weight_version == 7 and engine.model_path == v7
    calls = engine.fake.calls
    i = calls.index(("pause", "abort", True))
    assert calls[i + 1 : i + 4] == [("rpc", "reload_weights", ["weights_path"]), ("reset_prefix_cache",), ("resume",)]


def test_while_paused_new_requests_wait_and_an_update_does_not_resume(engine, tmp_path):
    assert engine.pause().result(timeout=10) == 0
    fut = engine.submit(req("waits", n=2))
    assert engine.update_weights(ckpt(tmp_path, "v4")) == 4  # default: current + 1
    time.sleep(0.1)
    assert not fut.done() and engine.stats().paused
    engine.resume().result(timeout=10)
    r = fut.result(timeout=10)
    assert r.output_ids == [8, 9] and r.weight_version == 4


def test_a_failed_load_keeps_the_version_and_resumes(engine, tmp_path):
    with pytest.raises(RuntimeError, match="no such checkpoint"):
        engine.update_weights(ckpt(tmp_path, "broken", broken=True), 9)
    assert engine.weight_version == 3 and engine.fake.calls[-1] == ("resume",)
    assert engine.submit(req("after", n=2)).result(timeout=10).weight_version == 3


def test_tensors_reach_the_workers_through_a_safetensors_file_removed_after(engine):
    import torch

    seen = []
    rpc = engine.fake.collective_rpc

    async def record(method, timeout=None, args=(), kwargs=None):
        path = kwargs["weights_path"]
        seen.append((path, sorted(os.listdir(path))))
        return await rpc(method, timeout, args, kwargs)

    engine.fake.collective_rpc = record
    assert engine.update_weights_from_state({"w": torch.ones(2)}, 5, "broadcast") == 5
    ((path, files),) = seen
    assert files == ["model.safetensors"] and not os.path.exists(path)


def test_stop_aborts_what_runs_and_refuses_more(engine):
    engine.fake.step_s = 0.05
    fut = engine.submit(req("left", n=200))
    engine.stop()
    assert fut.result(timeout=10).finish_reason["type"] == "abort"
    assert ("shutdown",) in engine.fake.calls and not engine.is_alive()
    with pytest.raises(Exception, match="stopped"):
        engine.submit(req("late"))


def test_a_dead_vllm_engine_fails_its_requests_and_reports_itself_dead(engine):
    class EngineDeadError(Exception):
        pass

    async def dead(prompt, params, request_id):
        raise EngineDeadError("EngineCore encountered an issue")
        yield  # an async generator, as AsyncLLM.generate

    engine.fake.generate = dead
    with pytest.raises(Exception, match="EngineCore encountered an issue") as e:
        engine.submit(req("doomed")).result(timeout=10)
    assert type(e.value).__name__ == "EngineClosedError" and not engine.is_alive()
    with pytest.raises(Exception, match="vLLM engine failed"):
        engine.submit(req("after"))


def test_checkpoints_vllm_cannot_load_in_place_never_reach_it(engine, tmp_path):
    with pytest.raises(FileNotFoundError, match="pruned, or never written"):
        engine.update_weights(str(tmp_path / "gone"), 5)
    with pytest.raises(ValueError, match=r"not the served model's architecture: hidden_size 256 \(served: 128\)"):
        engine.update_weights(ckpt(tmp_path, "wider", hidden_size=256), 5)
    assert not [c for c in engine.fake.calls if c[0] in ("rpc", "pause")] and engine.weight_version == 3
    assert engine.submit(req("still", n=2)).result(timeout=10).weight_version == 3


def test_the_checkpoint_is_read_from_a_private_copy(engine, tmp_path):
    # The trainer may prune the folder while vLLM reads it: vLLM gets a copy, removed after.
    v5 = ckpt(tmp_path, "v5")
    engine.update_weights(v5, 5)
    loaded = [c for c in engine.fake.calls if c[0] == "rpc"]
    assert loaded and os.path.isdir(v5)


def test_on_a_cpu_the_kv_cache_is_sized_for_the_config_not_a_share_of_host_memory(tmp_path):
    """vLLM's CPU default reserves gpu_memory_utilization (0.9) of the host's memory and refuses to
    start when a trainer holds some of it: realhf asks for what max_num_seqs full requests need."""
    from realhf.impl.inference.vllm_engine import CPU_KV_MAX_BYTES, CPU_KV_MIN_BYTES, kv_cache_bytes

    (tmp_path / "config.json").write_text(
        json.dumps({"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512, "num_hidden_layers": 4})
    )
    cfg = VLLMConfig(max_num_seqs=256, dtype="float32")
    # 2 (K and V) x 4 layers x 2 heads x 64 dims x 4 bytes per token, 256 x 1024 tokens
    assert kv_cache_bytes(str(tmp_path), cfg, 1024, on_cpu=True) == 2 * 4 * 2 * 64 * 4 * 256 * 1024
    assert kv_cache_bytes(str(tmp_path), VLLMConfig(max_num_seqs=1), 16, on_cpu=True) == CPU_KV_MIN_BYTES
    assert kv_cache_bytes(str(tmp_path), cfg, 1 << 20, on_cpu=True) == CPU_KV_MAX_BYTES
    assert kv_cache_bytes(str(tmp_path), cfg, 1024, on_cpu=False) is None  # a GPU: vLLM sizes it
    assert kv_cache_bytes(str(tmp_path), VLLMConfig(kv_cache_gib=0.5), 1024, on_cpu=False) == 2**29


def test_a_stop_check_ends_the_answer_at_its_token_and_aborts_the_rest_in_vllm(engine):
    seen, streamed = [], []
    r = req("s", n=10)
    r.stop_check = lambda ids: seen.append(list(ids)) or ("ten" if ids[-1] == 10 else None)
    r.on_token = lambda t, lp: streamed.append(t)
    out = engine.submit(r).result(timeout=10)
    assert out.output_ids == [8, 9, 10] and out.finish_reason == {"type": "stop", "matched": "ten"}
    assert out.output_logprobs == pytest.approx([-0.1, -0.2, -0.3]) and streamed == [8, 9]
    assert seen == [[8], [8, 9], [8, 9, 10]]
    assert "s" in engine.fake.aborted  # vLLM stops decoding it
    # A token that ends the answer by length is not checked (SGLang checks the length first).
    late = req("late", n=3)
    late.stop_check = lambda ids: "x" if len(ids) >= 3 else None
    assert engine.submit(late).result(timeout=10).finish_reason == {"type": "length", "length": 3}
