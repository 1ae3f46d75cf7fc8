"""Decode attention over the slotted KV cache: one new query per slot against that slot's columns.

    out[b, h] = softmax(q[b, h] · K[b, h / group, :len[b]]ᵀ · scale) · V[b, h / group, :len[b]]

Two implementations of the same formula (equal up to float rounding; tests check it):

- `torch_decode_attention`: batched matmuls over columns 0..T-1 (T = the longest row) with an
  additive mask for the shorter rows. Runs everywhere, any dtype; the caller writes the step's
  new keys/values into the cache first.
- `DecodeAttentionKernel` (from `load_kernel()`): a 60-line C loop, compiled on first use with
  the system C compiler and called through ctypes. For each slot it writes the new key/value
  into column len-1 and then reads the slot's own columns 0..len-1 once, in memory order.

Why the kernel: at 256 running slots the KV cache (tens of MB per layer) is far larger than the
CPU caches, so a decode step's attention is a stream over memory. The batched matmuls are
[1 × d]·[d × T] products per (slot, head) and reached ≈ 5 GB/s on that stream here; the plain
loop, which asks for the next rows before it needs them, ≈ 10 GB/s (a bare `sum` ≈ 14.5), and it
skips the masked columns and the scattered cache write: attention plus cache write of a decode
step went from ≈ 26 to ≈ 12.5 ms at 256 slots (docs/benchmarks.md, "Engine decode step").

The kernel is fp32, CPU only and single-threaded (the engine runs one torch thread): on another
device 'auto' means the torch path and 'kernel' is refused before anything is allocated. Where no C
compiler is found, or the build fails, `load_kernel()` returns None with the reason logged once
and the engine uses the torch path. Memory safety rests on the wrapper's checks (dtypes, shapes,
strides, max length); a slot length outside [1, context_len] that slipped past a caller gives NaN
in the C loop rather than a write outside the slot.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Optional

import torch

from realhf.api.choices import DECODE_ATTENTION
from realhf.base import logging
from realhf.base.user_cache import private_cache_dir

logger = logging.getLogger("decode_attention")

_C_SOURCE = r"""
#include <math.h>
#include <stdint.h>

#define PREFETCH_ROW(p, d) for (int64_t j_ = 0; j_ < (d); j_ += 16) __builtin_prefetch((p) + j_, 0, 3)

/* q: [n, H, d], k_new and v_new: [n, KVH, d], each with its own stride (in floats) from one
   slot to the next; k_cache, v_cache: one layer, [S, KVH, C, d] (rows 0..n-1 used);
   lens: [n], columns 0..lens[b]-1 of slot b are visible; out: [n, H, d]; scratch: [C] floats.
   Writes k_new/v_new into column lens[b]-1, then attends over columns 0..lens[b]-1. */
void decode_attention(const float* q, int64_t q_stride, const float* k_new, int64_t k_stride,
                      const float* v_new, int64_t v_stride, float* k_cache, float* v_cache,
                      const int64_t* lens, float* out, int64_t n, int64_t H, int64_t KVH, int64_t C, int64_t d,
                      float scale, float* scratch) {
  const int64_t group = H / KVH;
  for (int64_t b = 0; b < n; b++) {
    const int64_t L = lens[b];
    if (L < 1 || L > C) { /* a caller's bug: never touch memory outside the slot for it */
      for (int64_t i = 0; i < H * d; i++) out[b * H * d + i] = NAN;
      continue;
    }
    for (int64_t h = 0; h < H; h++) {
      float* K = k_cache + (b * KVH + h / group) * C * d;
      float* V = v_cache + (b * KVH + h / group) * C * d;
      const float* qh = q + b * q_stride + h * d;
      if (h % group == 0) { /* the step's new key and value, once per KV head */
        for (int64_t i = 0; i < d; i++) K[(L - 1) * d + i] = k_new[b * k_stride + (h / group) * d + i];
        for (int64_t i = 0; i < d; i++) V[(L - 1) * d + i] = v_new[b * v_stride + (h / group) * d + i];
      }
      float* o = out + (b * H + h) * d;
      /* The (slot, head) after this one: its keys are requested from memory while this one
         computes, as are this one's values during the scores (the loop is memory-bound). */
      const int64_t nb = h + 1 < H ? b : b + 1, nh = h + 1 < H ? h + 1 : 0;
      const float* K_next = nb < n ? k_cache + (nb * KVH + nh / group) * C * d : K;
      const int64_t L_next = nb < n && lens[nb] <= C ? lens[nb] : 0;

      /* scores and their max */
      float m = -INFINITY;
      for (int64_t t = 0; t < L; t++) {
        const float* k = K + t * d;
        PREFETCH_ROW(V + t * d, d);
        float s = 0.f;
        #pragma omp simd reduction(+:s)
        for (int64_t i = 0; i < d; i++) s += qh[i] * k[i];
        s *= scale;
        scratch[t] = s;
        m = s > m ? s : m;
      }
      /* softmax, as torch computes it: exp(s - max) / sum */
      float sum = 0.f;
      for (int64_t t = 0; t < L; t++) {
        const float e = expf(scratch[t] - m);
        scratch[t] = e;
        sum += e;
      }
      /* probabilities times values */
      for (int64_t i = 0; i < d; i++) o[i] = 0.f;
      for (int64_t t = 0; t < L; t++) {
        if (t < L_next) PREFETCH_ROW(K_next + t * d, d);
        const float p = scratch[t] / sum;
        const float* v = V + t * d;
        #pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] += p * v[i];
      }
      for (int64_t t = L; t < L_next; t++) PREFETCH_ROW(K_next + t * d, d);
    }
  }
}
"""


def decode_mask(positions: torch.Tensor, T: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [n, 1, 1, T] of `torch_decode_attention`: slot b sees columns 0..positions[b];
    the columns after it hold stale or padding values."""
    visible = torch.arange(T, device=positions.device)[None, :] <= positions[:, None]  # [n, T]
    mask = torch.zeros(len(positions), 1, 1, T, dtype=dtype, device=positions.device)  # [n, 1, 1, T]
    return mask.masked_fill_(~visible[:, None, None, :], float("-inf"))


def torch_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """q: [n, H, d]; k_cache/v_cache: one layer [S, KVH, C, d]; mask: `decode_mask(positions, T)`.
    Returns [n, H, d]."""
    n, H, d = q.shape
    KVH, T = k_cache.shape[1], mask.shape[-1]
    keys, values = k_cache[:n, :, :T], v_cache[:n, :, :T]  # views: [n, KVH, T, d]
    # GQA without repeating the cache: the query heads sharing a KV head become the "query
    # length" axis of that KV head.
    qg = q.view(n, KVH, H // KVH, d)
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale + mask  # [n, KVH, group, T]
    att = torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), values)
    return att.view(n, H, d)


class DecodeAttentionKernel:
    """The compiled C loop behind a checked call."""

    def __init__(self, lib_path: str):
        self.path = lib_path
        self._fn = ctypes.CDLL(lib_path).decode_attention
        p, i = ctypes.c_void_p, ctypes.c_int64
        self._fn.argtypes = [p, i, p, i, p, i, p, p, p, p, i, i, i, i, i, ctypes.c_float, p]
        self._fn.restype = None

    def __call__(
        self,
        q: torch.Tensor,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        lens: torch.Tensor,
        max_len: int,
        scale: float,
        out: Optional[torch.Tensor] = None,
        scratch: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Write each slot's new key/value at column lens[b]-1 of the cache, then attend over its
        columns 0..lens[b]-1 — one pass over memory instead of a scattered write and a read.

        q: [n, H, d]; k_new, v_new: [n, KVH, d] (each slot's heads contiguous: views into a wider
        projection output are fine); k_cache/v_cache: one layer [S, KVH, C, d], written in place;
        lens: [n] int64; max_len: max(lens), which the caller already knows. Returns [n, H, d]."""
        n, H, d = q.shape
        S, KVH, C, d_cache = k_cache.shape
        # The C loop trusts these; a wrong one would read outside the tensors.
        for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
            if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(
                    f"decode attention kernel: {name} must be a contiguous float32 CPU tensor, "
                    f"got {t.dtype} on {t.device} with strides {t.stride()}"
                )
        for name, t, heads in (("q", q, H), ("k_new", k_new, KVH), ("v_new", v_new, KVH)):
            if (
                t.dtype != torch.float32
                or t.device.type != "cpu"
                or t.shape != (n, heads, d)
                or t.stride()[1:] != (d, 1)
                or (n > 1 and t.stride(0) < heads * d)
            ):
                raise ValueError(
                    f"decode attention kernel: {name} must be a float32 CPU tensor [{n}, {heads}, {d}] "
                    f"with each slot's heads contiguous, got {t.dtype} {tuple(t.shape)} "
                    f"strides {t.stride()}"
                )
        if v_cache.shape != k_cache.shape or d_cache != d or n > S or H % KVH:
            raise ValueError(
                f"decode attention kernel: shapes do not fit: q {tuple(q.shape)}, "
                f"k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
            )
        if lens.dtype != torch.int64 or lens.device.type != "cpu" or not lens.is_contiguous() or lens.shape != (n,):
            raise ValueError(
                f"decode attention kernel: lens must be contiguous int64 [{n}], got {lens.dtype} {tuple(lens.shape)}"
            )
        if not 1 <= max_len <= C:
            raise ValueError(f"decode attention kernel: max_len {max_len} outside [1, context_len={C}]")
        # On q's device (the CPU, checked above), whatever torch's default device is: the C loop
        # writes through these pointers.
        if out is None:
            out = torch.empty(n, H, d, device=q.device)
        if scratch is None or scratch.numel() < C:
            scratch = torch.empty(C, device=q.device)
        if out.shape != (n, H, d) or out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous():
            raise ValueError(f"decode attention kernel: out must be a contiguous float32 CPU tensor [{n}, {H}, {d}]")
        if scratch.dtype != torch.float32 or scratch.device.type != "cpu" or not scratch.is_contiguous():
            raise ValueError(f"decode attention kernel: scratch must be a contiguous float32 CPU tensor of >= {C}")
        self._fn(
            q.data_ptr(),
            q.stride(0),
            k_new.data_ptr(),
            k_new.stride(0),
            v_new.data_ptr(),
            v_new.stride(0),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            lens.data_ptr(),
            out.data_ptr(),
            n,
            H,
            KVH,
            C,
            d,
            scale,
            scratch.data_ptr(),
        )
        return out


# --------------------------------------------------------------------------------------------
# Building the kernel: once per process, cached on disk per source + flags + CPU capability
# --------------------------------------------------------------------------------------------

_lock = threading.Lock()
_loaded: dict = {}


def _flags() -> list:
    flags = ["-O3", "-shared", "-fPIC", "-fopenmp-simd", "-fno-math-errno"]
    # AVX2 + FMA only where torch itself found them: the cached library must run on this CPU.
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


def _cache_dir() -> str:
    return private_cache_dir("kernels")


def _build(cc: str) -> str:
    flags = _flags()
    key = hashlib.sha256(
        "\n".join([_C_SOURCE, cc, " ".join(flags), torch.backends.cpu.get_cpu_capability()]).encode()
    ).hexdigest()[:16]
    out_dir = _cache_dir()
    lib = os.path.join(out_dir, f"decode_attention_{key}.so")
    if os.path.isfile(lib):
        return lib
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        src = os.path.join(tmp, "decode_attention.c")
        with open(src, "w") as f:
            f.write(_C_SOURCE)
        tmp_lib = os.path.join(tmp, "decode_attention.so")
        proc = subprocess.run([cc, *flags, src, "-o", tmp_lib, "-lm"], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
        os.replace(tmp_lib, lib)  # atomic: concurrent builders never load a half-written file
    return lib


def load_kernel() -> Optional[DecodeAttentionKernel]:
    """The compiled kernel, or None (reason logged once) when it cannot be built here."""
    with _lock:
        if "kernel" not in _loaded:
            kernel, cc = None, os.environ.get("CC") or "cc"
            try:
                if shutil.which(cc) is None:
                    raise RuntimeError(f"no C compiler {cc!r} on PATH (set CC to use another)")
                kernel = DecodeAttentionKernel(_build(cc))
                logger.info(f"decode attention kernel loaded from {kernel.path}")
            except Exception as e:  # any failure means the torch path, never a broken engine
                logger.warning(f"decode attention kernel unavailable, using torch matmuls: {e}")
            _loaded["kernel"] = kernel
        return _loaded["kernel"]


def resolve_attention(
    choice: str, dtype: torch.dtype, device: Optional[torch.device] = None
) -> Optional[DecodeAttentionKernel]:
    """The kernel to use for `choice` ('auto' | 'kernel' | 'torch') on `device` (default: the
    CPU), or None for the torch path. Allocates nothing, so callers decide before loading."""
    if choice not in DECODE_ATTENTION:
        raise ValueError(f"decode attention must be one of {DECODE_ATTENTION}, got {choice!r}")
    if choice == "torch":
        return None
    if device is not None and device.type != "cpu":
        # The C loop reads host memory through raw pointers: a GPU cache would be a segfault.
        if choice == "kernel":
            raise ValueError(
                f"gen_server.native.decode_attention=kernel (launch_server: --decode-attention) runs "
                f"on the CPU only, but the engine's device is {device}; use 'auto' or 'torch'"
            )
        return None
    if dtype != torch.float32:
        if choice == "kernel":
            raise ValueError(f"the decode attention kernel is float32 only; got dtype {dtype} (use 'torch' or 'auto')")
        return None
    kernel = load_kernel()
    if kernel is None and choice == "kernel":
        raise RuntimeError("decode attention 'kernel' was asked for but could not be built (see the log)")
    return kernel
