"""The decode-attention kernel against the torch formula, and the transformer's two paths against each other."""

import pytest
import torch

from realhf.base.user_cache import is_private_dir
from realhf.impl.inference import decode_attention as da
from realhf.impl.inference.decode_attention import decode_mask, load_kernel, resolve_attention, torch_decode_attention
from realhf.impl.inference.transformer import StaticKVTransformer, load_model


@pytest.fixture(scope="module")
def kernel():
    k = load_kernel()
    if k is None:
        pytest.skip("no C compiler here: the decode attention kernel cannot be built (the torch path is used)")
    return k


def random_case(n, S, H, KVH, C, d, seed):
    g = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(S, KVH, C, d, generator=g)
    v_cache = torch.randn(S, KVH, C, d, generator=g)
    # q, k, v as views into one projection output, as the transformer passes them.
    qkv = torch.randn(n, H + 2 * KVH, d, generator=g)
    q, k_new, v_new = qkv.split([H, KVH, KVH], dim=1)
    lens = torch.randint(1, C + 1, (n,), generator=g)
    lens[0] = C  # one row uses the whole context
    lens[-1] = 1  # and one sees only its own new column
    return q, k_new, v_new, k_cache, v_cache, lens


@pytest.mark.parametrize("H,KVH,d", [(4, 4, 64), (4, 2, 16), (8, 1, 32)])
def test_kernel_writes_the_new_column_and_equals_the_masked_torch_formula(kernel, H, KVH, d):
    n, S, C = 13, 16, 40
    q, k_new, v_new, k_cache, v_cache, lens = random_case(n, S, H, KVH, C, d, seed=H * d + KVH)
    # Reference: index-write the new column, then batched matmuls with the additive mask.
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    rows, pos = torch.arange(n), lens - 1
    k_ref[rows, :, pos] = k_new
    v_ref[rows, :, pos] = v_new
    T = int(lens.max())
    want = torch_decode_attention(q.contiguous(), k_ref, v_ref, decode_mask(pos, T, torch.float32), H**-0.5)

    got = kernel(q, k_new, v_new, k_cache, v_cache, lens, T, H**-0.5)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)  # rows >= n untouched too
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_columns_past_a_slots_length_do_not_change_its_output(kernel):
    # The kernel must never read stale columns: fill them with huge values and compare.
    q, k_new, v_new, k_cache, v_cache, lens = random_case(6, 6, 4, 2, 32, 16, seed=5)
    out1 = kernel(q, k_new, v_new, k_cache.clone(), v_cache.clone(), lens, int(lens.max()), 0.25).clone()
    for b, L in enumerate(lens.tolist()):
        k_cache[b, :, L:] = 1e4
        v_cache[b, :, L:] = -1e4
    out2 = kernel(q, k_new, v_new, k_cache, v_cache, lens, int(lens.max()), 0.25)
    assert torch.equal(out1, out2)


def test_kernel_refuses_tensors_it_could_misread_naming_the_argument(kernel):
    q, k_new, v_new, k_cache, v_cache, lens = random_case(4, 4, 4, 2, 16, 16, seed=1)
    T = int(lens.max())
    with pytest.raises(ValueError, match="k_cache"):
        kernel(q, k_new, v_new, k_cache.transpose(2, 3), v_cache, lens, T, 0.25)
    with pytest.raises(ValueError, match="k_cache"):
        kernel(q, k_new, v_new, k_cache.double(), v_cache, lens, T, 0.25)
    with pytest.raises(ValueError, match="q must"):
        kernel(q.transpose(1, 2), k_new, v_new, k_cache, v_cache, lens, T, 0.25)
    with pytest.raises(ValueError, match="v_new"):
        kernel(q, k_new, v_new[:, :1], k_cache, v_cache, lens, T, 0.25)
    with pytest.raises(ValueError, match="lens"):
        kernel(q, k_new, v_new, k_cache, v_cache, lens.int(), T, 0.25)
    with pytest.raises(ValueError, match="max_len"):
        kernel(q, k_new, v_new, k_cache, v_cache, lens, 17, 0.25)
    with pytest.raises(ValueError, match="shapes"):
        kernel(q, k_new, v_new, k_cache[:3], v_cache[:3], lens, T, 0.25)  # 4 slots, a 3-slot cache


def test_transformer_decode_is_the_same_with_the_kernel_and_with_torch_matmuls(kernel, qwen_path):
    # Prefill 5 prompts of different lengths, then 6 decode steps on both paths; the logits of
    # every step must agree (the kernel only changes the order of float additions).
    args, weights = load_model(qwen_path, torch.float32)
    models = {a: StaticKVTransformer(args, weights, 8, 64, torch.float32, attention=a) for a in ("kernel", "torch")}
    assert models["kernel"].attention_kernel is not None and models["torch"].attention_kernel is None
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 9, 1, 14, 6])
    prompts = torch.randint(3, args.vocab_size, (5, 14), generator=g)
    logits = {a: m.prefill(torch.arange(5), prompts, lengths) for a, m in models.items()}
    tokens, positions = logits["torch"].argmax(-1), lengths.clone()
    for _ in range(6):
        out = {a: m.decode(tokens, positions) for a, m in models.items()}
        assert torch.allclose(out["kernel"], out["torch"], atol=1e-4, rtol=1e-4), (
            (out["kernel"] - out["torch"]).abs().max()
        )
        tokens, positions = out["torch"].argmax(-1), positions + 1
    n = 5
    assert torch.allclose(models["kernel"].k_cache[:, :n], models["torch"].k_cache[:, :n], atol=1e-5)


def test_attention_choice_is_validated_and_bf16_uses_torch():
    with pytest.raises(ValueError, match="decode attention must be one of"):
        resolve_attention("fast", torch.float32)
    assert resolve_attention("torch", torch.float32) is None
    assert resolve_attention("auto", torch.bfloat16) is None
    with pytest.raises(ValueError, match="float32 only"):
        resolve_attention("kernel", torch.bfloat16)


def test_without_a_compiler_auto_falls_back_to_torch_and_kernel_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(da, "_loaded", {})  # forget the kernel this process already loaded
    assert resolve_attention("auto", torch.float32) is None
    with pytest.raises(RuntimeError, match="could not be built"):
        resolve_attention("kernel", torch.float32)


@pytest.mark.system
def test_a_fresh_build_lands_in_the_cache_dir_and_is_reused(monkeypatch, tmp_path):
    if load_kernel() is None:
        pytest.skip("no C compiler here")
    cache = tmp_path / "realhf" / "kernels"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(da, "_loaded", {})
    first = load_kernel()
    assert first is not None and first.path.startswith(str(cache))
    built = sorted(p.name for p in cache.iterdir())
    assert len(built) == 1 and built[0].endswith(".so")  # no temp files left behind
    monkeypatch.setattr(da, "_loaded", {})
    assert load_kernel().path == first.path


def test_a_cache_dir_others_can_write_to_is_not_used(monkeypatch, tmp_path):
    # A library planted in a group/world-writable directory must never be loaded.
    shared = tmp_path / "shared" / "realhf" / "kernels"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "shared"))
    assert not is_private_dir(str(shared))
    assert da._cache_dir() != str(shared)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "private"))
    private = tmp_path / "private" / "realhf" / "kernels"
    assert da._cache_dir() == str(private) and (private.stat().st_mode & 0o077) == 0


def test_off_the_cpu_auto_means_torch_and_the_kernel_is_refused_naming_the_config_field():
    # A GPU device object allocates nothing by itself: the decision is made without touching it.
    gpu = torch.device("cuda", 0)
    assert resolve_attention("auto", torch.float32, gpu) is None
    assert resolve_attention("torch", torch.float32, gpu) is None
    with pytest.raises(ValueError, match="gen_server.native.decode_attention"):
        resolve_attention("kernel", torch.float32, gpu)


def test_an_engine_asked_for_the_kernel_on_a_gpu_is_refused_before_loading_anything(qwen_path, monkeypatch):
    from realhf.impl.inference import runners
    from realhf.impl.inference.factory import create_engine

    def no_loading(*args, **kwargs):
        raise AssertionError("weights were loaded before the decode attention choice was checked")

    monkeypatch.setattr(runners, "load_model", no_loading)
    with pytest.raises(ValueError, match="gen_server.native.decode_attention.*cuda:0"):
        create_engine(qwen_path, kind="static_kv", attention="kernel", device=torch.device("cuda", 0))
