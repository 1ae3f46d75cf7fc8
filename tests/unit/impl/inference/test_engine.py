"""The native engine without HTTP: continuous batching, stopping rules, sampling, control."""

import json
import os
import shutil
import threading
import time

import pytest
import torch

from helpers.native_server import decode_fails_once, held_tensors
from realhf.impl.inference.factory import create_engine
from realhf.impl.inference.hf_runner import HFRunner
from realhf.impl.inference.request import EngineClosedError, GenerateRequest, SamplingParams, check_request
from realhf.impl.inference.runners import StaticKVRunner
from realhf.impl.inference.sampling import sample
from realhf.impl.inference.slots import SlotState


def wait_active(engine, n, timeout=30.0):
    deadline = time.monotonic() + timeout
    while engine.n_active < n:
        assert time.monotonic() < deadline, f"engine never had {n} running requests"
        time.sleep(0.01)


def req(prompt, rid="", **kw):
    kw.setdefault("ignore_eos", True)
    return GenerateRequest(list(prompt), SamplingParams(**kw), rid)


@pytest.fixture
def engine_factory(qwen_path):
    made = []

    def make(path=qwen_path, **kw):
        kw.setdefault("max_running_requests", 8)
        kw.setdefault("context_length", 512)
        e = create_engine(path, **kw).start()
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop()


def test_more_requests_than_slots_queue_join_and_leave_with_results_independent_of_the_batch(engine_factory, hf_ref):
    # 3 slots, 12 greedy requests of different prompt and answer lengths: requests join as others
    # leave, slots get compacted; each answer must equal the same request run alone by HF.
    engine = engine_factory(max_running_requests=3)
    prompts = [[3 + i] * (1 + i % 5) + [40 + i] for i in range(12)]
    lengths = [4 + 3 * (i % 4) for i in range(12)]
    futures = [engine.submit(req(p, max_new_tokens=n, temperature=0.0)) for p, n in zip(prompts, lengths)]
    for p, n, f in zip(prompts, lengths, futures):
        res = f.result(timeout=30)
        assert res.output_ids == hf_ref.greedy(p, n)
        assert res.finish_reason == {"type": "length", "length": n}
    assert engine.n_active == 0 and engine.stats().queued == 0


def test_eos_ends_the_answer_unless_ignore_eos(engine_factory, qwen_path, hf_ref, tmp_path):
    prompt = [9, 8, 7]
    free = hf_ref.greedy(prompt, 12)
    eos = free[3]
    # The same weights with that token declared EOS in config.json.
    path = str(tmp_path / "eos_model")
    shutil.copytree(qwen_path, path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = eos
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    engine = engine_factory(path)
    stopped = engine.submit(req(prompt, max_new_tokens=12, temperature=0.0, ignore_eos=False)).result(30)
    assert stopped.output_ids == free[: free.index(eos) + 1]
    assert stopped.finish_reason == {"type": "stop", "matched": eos}
    ignored = engine.submit(req(prompt, max_new_tokens=12, temperature=0.0, ignore_eos=True)).result(30)
    assert ignored.output_ids == free and ignored.finish_reason["type"] == "length"


def test_min_new_tokens_keeps_stop_tokens_out_until_reached(engine_factory, hf_ref):
    prompt = [9, 8, 7]
    free = hf_ref.greedy(prompt, 12)
    stop = free[0]  # would stop at once
    engine = engine_factory()
    res = engine.submit(
        req(prompt, max_new_tokens=12, temperature=0.0, stop_token_ids=[stop], min_new_tokens=4)
    ).result(30)
    assert stop not in res.output_ids[:4]
    assert len(res.output_ids) >= 4


def test_sampling_frequencies_follow_softmax_of_logits_over_temperature():
    # 20000 draws from one row: every frequency within 0.02 of its probability.
    torch.manual_seed(0)
    logits = torch.randn(1, 8) * 2
    n = 20000
    g = torch.Generator().manual_seed(3)
    rows = logits.expand(n, 8).contiguous()
    temp = torch.full((n,), 0.7)
    tokens, logprobs = sample(
        rows,
        temp,
        torch.ones(n),
        torch.full((n,), 8),
        all_greedy=False,
        any_greedy=False,
        any_filter=False,
        generator=g,
    )
    probs = torch.softmax(logits[0] / 0.7, -1)
    freq = torch.bincount(tokens, minlength=8).float() / n
    assert (freq - probs).abs().max() < 0.02
    assert torch.allclose(logprobs, probs.log()[tokens], atol=1e-5)


def test_top_k_and_top_p_restrict_the_sampled_set():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]]).expand(5000, 6).contiguous()
    n = logits.shape[0]
    g = torch.Generator().manual_seed(1)
    tokens, _ = sample(
        logits,
        torch.ones(n),
        torch.ones(n),
        torch.full((n,), 2),
        all_greedy=False,
        any_greedy=False,
        any_filter=True,
        generator=g,
    )
    assert set(tokens.tolist()) == {0, 1}
    probs = torch.softmax(logits[0], -1)  # 0.64, 0.24, ...: top_p 0.7 keeps tokens 0 and 1
    tokens, _ = sample(
        logits,
        torch.ones(n),
        torch.full((n,), 0.7),
        torch.full((n,), 6),
        all_greedy=False,
        any_greedy=False,
        any_filter=True,
        generator=g,
    )
    assert set(tokens.tolist()) == {0, 1}, probs


def test_greedy_and_sampled_rows_mix_in_one_batch():
    logits = torch.tensor([[0.0, 1.0, 0.5]] * 4)
    temp = torch.tensor([0.0, 1.0, 0.0, 1.0])
    tokens, lps = sample(
        logits,
        temp,
        torch.ones(4),
        torch.full((4,), 3),
        all_greedy=False,
        any_greedy=True,
        any_filter=False,
        generator=torch.Generator().manual_seed(0),
    )
    assert tokens[0] == 1 and tokens[2] == 1
    assert torch.allclose(lps[0], torch.log_softmax(logits[0], -1)[1])


def test_abort_by_rid_for_queued_and_running_requests(engine_factory):
    engine = engine_factory(max_running_requests=1, context_length=2048)
    running = engine.submit(req([3, 4], rid="run", max_new_tokens=2000))
    queued = engine.submit(req([5, 6], rid="queued", max_new_tokens=5))
    wait_active(engine, 1)
    assert engine.abort("queued").result(5) is True
    assert engine.abort("run").result(5) is True
    assert engine.abort("nobody").result(5) is False
    r, q = running.result(5), queued.result(5)
    assert r.finish_reason["type"] == "abort" and 0 < len(r.output_ids) < 2000
    assert len(r.output_logprobs) == len(r.output_ids)
    assert q.finish_reason["type"] == "abort" and q.output_ids == []


def test_duplicate_rid_and_invalid_requests_are_refused_with_the_field_named(engine_factory):
    engine = engine_factory(max_running_requests=1, context_length=2048)
    engine.submit(req([3], rid="same", max_new_tokens=1500))
    with pytest.raises(ValueError, match="same"):
        engine.submit(req([3], rid="same", max_new_tokens=5))
    assert "input_ids" in check_request(req([]), 256, 512)
    assert "max_new_tokens" in check_request(req([1], max_new_tokens=-2), 256, 512)
    assert "context length" in check_request(req([1] * 10, max_new_tokens=503), 256, 512)
    assert check_request(req([1] * 10, max_new_tokens=502), 256, 512) is None
    assert "stop_token_ids" in check_request(req([1], stop_token_ids=[256]), 256, 512)
    engine.abort_all().result(5)


def test_weight_swap_between_steps_aborts_running_requests_and_bumps_the_version(engine_factory, qwen_path_b, hf_ref_b):
    engine = engine_factory(max_running_requests=4, context_length=2048)
    running = engine.submit(req([3, 4], max_new_tokens=2000, temperature=1.0))
    wait_active(engine, 1)
    assert engine.update_weights(qwen_path_b, 4) == 4
    old = running.result(10)
    assert old.finish_reason["type"] == "abort" and old.weight_version == 0  # every token from v0
    new = engine.submit(req([3, 4], max_new_tokens=10, temperature=0.0)).result(30)
    assert new.weight_version == 4 and new.output_ids == hf_ref_b.greedy([3, 4], 10)
    # Default version: current + 1.
    assert engine.update_weights(qwen_path_b) == 5


def test_keep_running_on_update_decodes_on_with_the_new_weights_and_tags_each_token(engine_factory, qwen_path_b):
    engine = engine_factory(max_running_requests=4, context_length=2048, keep_running_on_update=True)
    running = engine.submit(req([3, 4], max_new_tokens=400, temperature=1.0, ignore_eos=True))
    wait_active(engine, 1)
    while engine.generation_tokens_total < 5:  # some tokens from version 0 first
        time.sleep(0.005)
    assert engine.update_weights(qwen_path_b, 4) == 4
    out = running.result(60)
    assert out.finish_reason["type"] == "length" and len(out.output_ids) == 400  # not aborted
    assert out.weight_version == 4
    (start0, v0), (switch, v1) = out.weight_version_changes
    assert (start0, v0, v1) == (0, 0, 4) and 0 < switch < 400, out.weight_version_changes
    meta = out.to_sglang()["meta_info"]  # SGLang's spans of the output tokens per version
    assert meta["weight_versions"] == [
        {"version": "0", "start": 0, "end": switch},
        {"version": "4", "start": switch, "end": 400},
    ]
    # A request that ran under one version: one span, the whole output.
    after = engine.submit(req([3, 4], max_new_tokens=5, temperature=0.0)).result(30)
    assert after.weight_version_changes is None
    assert after.to_sglang()["meta_info"]["weight_versions"] == [{"version": "4", "start": 0, "end": 5}]


def test_a_bad_checkpoint_leaves_the_old_weights_in_place(engine_factory, gpt2_path, hf_ref, tmp_path):
    engine = engine_factory()
    with pytest.raises(NotImplementedError, match="gpt2"):
        engine.update_weights(gpt2_path, 3)
    with pytest.raises(FileNotFoundError, match="config.json"):
        engine.update_weights(str(tmp_path), 3)
    res = engine.submit(req([3, 4], max_new_tokens=8, temperature=0.0)).result(30)
    assert res.weight_version == 0 and res.output_ids == hf_ref.greedy([3, 4], 8)


@pytest.mark.parametrize("kind", ["static_kv", "hf"])
def test_identical_prompts_admitted_together_are_prefilled_once_and_answer_as_if_alone(engine_factory, hf_ref, kind):
    # A prompt group's samples: 6 identical prompts and 2 others, admitted in one batch (queued
    # while paused). Every greedy answer and its log-probs must be what the prompt gives alone;
    # 5 of the 6 copies take the first one's keys and values instead of a prefill.
    engine = engine_factory(max_running_requests=8, kind=kind)
    group, others = [5, 9, 17, 3], [[5, 9, 17], [7, 7, 2, 2, 8]]
    alone = engine.submit(req(group, max_new_tokens=9, temperature=0.0)).result(30)
    assert engine.prefill_shared_total == 0
    assert engine.pause().result(5) == 0
    futures = [engine.submit(req(p, max_new_tokens=9, temperature=0.0)) for p in [group] * 3 + others + [group] * 3]
    engine.resume().result(5)
    results = [f.result(30) for f in futures]
    assert engine.prefill_shared_total == 5
    for p, r in zip([group] * 3 + others + [group] * 3, results):
        assert r.output_ids == hf_ref.greedy(p, 9)
    for r in results[:3] + results[5:]:
        assert r.output_ids == alone.output_ids
        torch.testing.assert_close(
            torch.tensor(r.output_logprobs), torch.tensor(alone.output_logprobs), atol=1e-4, rtol=0
        )


def test_pause_keeps_new_requests_queued_until_continue(engine_factory):
    engine = engine_factory()
    assert engine.pause().result(5) == 0
    f = engine.submit(req([3, 4], max_new_tokens=4))
    time.sleep(0.2)
    assert not f.done() and engine.stats().queued == 1 and engine.stats().paused
    engine.resume().result(5)
    assert len(f.result(10).output_ids) == 4


def test_stop_resolves_every_pending_request_with_abort_and_refuses_new_ones(qwen_path):
    engine = create_engine(qwen_path, max_running_requests=1, context_length=2048).start()
    running = engine.submit(req([3], max_new_tokens=2000))
    queued = engine.submit(req([4], max_new_tokens=5))
    time.sleep(0.1)
    engine.stop()
    assert running.result(1).finish_reason["type"] == "abort"
    assert queued.result(1).finish_reason["type"] == "abort"
    with pytest.raises(EngineClosedError):
        engine.submit(req([3], max_new_tokens=2))
    assert not any(t.name.startswith("engine-loop") and t.is_alive() for t in threading.enumerate())


# ---- the device ---------------------------------------------------------------------------------
def _off_device(obj, device):
    return {path: t.device for path, t in held_tensors(obj) if t.device != device}


@pytest.mark.parametrize("kind", ["static_kv", "hf"])
def test_every_tensor_the_engine_holds_is_on_the_device_it_was_given(engine_factory, kind):
    cpu = torch.device("cpu")
    engine = engine_factory(kind=kind, device=cpu)
    # Serve first: state widened on demand (the stop-token table) must land there too.
    engine.submit(req([3, 4], max_new_tokens=5, stop_token_ids=[7, 8, 9])).result(30)
    assert engine.device == cpu and engine.runner.device == cpu and engine.generator.device == cpu
    held = dict(held_tensors(engine))
    names = " ".join(held)
    assert all(part in names for part in ("slots.out_tok", "slots.stop_ids", "runner.")), names
    if kind == "static_kv":
        assert "runner.model.k_cache" in names and "runner.model.weights.embed" in names
    assert _off_device(engine, cpu) == {}


def test_runner_and_slot_state_allocate_everything_on_the_device_they_are_given(qwen_path):
    # The meta device allocates nothing and cannot run a step, but a tensor created without
    # `device=` would land on the CPU and show up here.
    meta = torch.device("meta")
    runners = [StaticKVRunner(qwen_path, 4, 64, device=meta), HFRunner(qwen_path, 4, 64, device=meta)]
    for runner in runners:
        assert runner.device == meta
        assert len(dict(held_tensors(runner, "runner"))) > 10
        assert _off_device(runner, meta) == {}
    assert runners[0].attention == "torch matmuls"  # 'auto' off the CPU: never the C kernel
    slots = SlotState(4, 64, 100, device=meta)
    assert _off_device(slots, meta) == {}


def test_the_step_loop_creates_every_tensor_on_the_engine_device(qwen_path, hf_ref):
    # Steps driven from this thread with the default device set to meta: any tensor the loop
    # created without naming the engine's device would be a meta tensor mixed into CPU math and
    # fail, so equal answers mean every per-step tensor was put on the engine's device.
    engine = create_engine(qwen_path, max_running_requests=2, context_length=128, device=torch.device("cpu"))
    prompts, lengths = [[9, 8, 7], [5], [3, 4, 5, 6]], [6, 3, 5]
    futures = [
        engine.submit(req(p, max_new_tokens=n, temperature=0.0, stop_token_ids=[1])) for p, n in zip(prompts, lengths)
    ]
    futures.append(engine.submit(req([3, 4], max_new_tokens=4, temperature=1.0, top_k=5, top_p=0.9)))
    with torch.device("meta"):
        while engine._waiting or engine.n_active:
            engine._admit()
            engine._decode_step()
    for p, n, f in zip(prompts, lengths, futures):
        want = hf_ref.greedy(p, n)
        want = want[: want.index(1) + 1] if 1 in want else want
        assert f.result(0).output_ids == want
    assert len(futures[-1].result(0).output_ids) == 4
    engine.stop()


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on_serving(engine_factory, hf_ref):
    from realhf.impl.inference.request import EngineStepError

    engine = engine_factory(max_running_requests=4)
    with decode_fails_once(engine):
        engine.pause().result(5)  # queue both, so that they are admitted and fail in the same step
        doomed = [engine.submit(req([3, 4], max_new_tokens=20, ignore_eos=True)) for _ in range(2)]
        engine.resume().result(5)
        for fut in doomed:
            with pytest.raises(EngineStepError, match="injected fault"):
                fut.result(30)
    assert engine.n_active == 0 and engine.failed_steps_total == 1
    out = engine.submit(req([3, 4], max_new_tokens=10, temperature=0.0)).result(30)
    assert out.output_ids == hf_ref.greedy([3, 4], 10)  # the same answer as before the fault


def test_an_engine_whose_steps_keep_failing_closes_instead_of_spinning(engine_factory):
    from realhf.impl.inference.request import EngineClosedError, EngineStepError

    engine = engine_factory(max_running_requests=4)

    def broken(*args, **kwargs):
        raise RuntimeError("the runner is broken")

    engine.runner.decode = broken
    errors = []
    for _ in range(5):
        try:
            engine.submit(req([3, 4], max_new_tokens=5, ignore_eos=True)).result(30)
        except (EngineStepError, EngineClosedError) as e:
            errors.append(type(e))
    # Each failed step failed its request; after 3 in a row the engine gave up: dead, named.
    assert errors[:2] == [EngineStepError, EngineStepError] and EngineClosedError in errors, errors
    assert not engine.is_alive()
    with pytest.raises(EngineClosedError, match="died"):
        engine.submit(req([3, 4], max_new_tokens=5))
    with pytest.raises(EngineClosedError):
        engine.pause()


def test_streaming_hands_over_every_token_but_the_last_which_comes_with_the_result(engine_factory):
    # So that a stream's last event carries the last token and the finish reason together, as
    # SGLang's does, instead of repeating the event before it with the finish reason added.
    engine = engine_factory()
    for n in (1, 5):
        seen = []
        r = req([3, 4, 5], max_new_tokens=n, temperature=0.0)
        r.on_token = lambda t, lp, seen=seen: seen.append((t, lp))
        out = engine.submit(r).result(timeout=30)
        assert [t for t, _ in seen] == out.output_ids[:-1] and len(out.output_ids) == n
        assert [lp for _, lp in seen] == out.output_logprobs[:-1]


def test_a_stop_check_ends_its_request_at_the_token_it_matches_and_leaves_the_others_be(engine_factory, hf_ref):
    # Stop strings come to the engine as a check of the output so far: the request that matches
    # ends at that token with SGLang's reason; the batch's others decode on to their length.
    engine = engine_factory()
    full = hf_ref.greedy([3, 4, 5], 12)
    seen_by_check, streamed = [], []

    def check(ids):
        seen_by_check.append(list(ids))
        return "matched" if len(ids) == 4 else None

    stopped = req([3, 4, 5], "stopped", max_new_tokens=12, temperature=0.0)
    stopped.stop_check = check
    stopped.on_token = lambda t, lp: streamed.append(t)
    other = req([3, 4, 5], "other", max_new_tokens=12, temperature=0.0)
    other.stop_check = lambda ids: None
    a, b = engine.submit_many([stopped, other])
    a, b = a.result(timeout=30), b.result(timeout=30)
    assert a.output_ids == full[:4] and a.finish_reason == {"type": "stop", "matched": "matched"}
    assert len(a.output_logprobs) == 4 and streamed == full[:3]  # the last comes with the result
    assert seen_by_check == [full[:k] for k in range(1, 5)]
    assert b.output_ids == full and b.finish_reason == {"type": "length", "length": 12}
    # A check that matches at the first token ends the answer there; one that would match at
    # the token reaching max_new_tokens does not: SGLang checks the length first.
    first = req([3, 4, 5], "first", max_new_tokens=4, temperature=0.0)
    first.stop_check = lambda ids: "x"
    assert engine.submit(first).result(timeout=30).output_ids == full[:1]
    late = req([3, 4, 5], "late", max_new_tokens=4, temperature=0.0)
    late.stop_check = lambda ids: "x" if len(ids) >= 4 else None
    assert engine.submit(late).result(timeout=30).finish_reason == {"type": "length", "length": 4}
    assert engine.n_active == 0
