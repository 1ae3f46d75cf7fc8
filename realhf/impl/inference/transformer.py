"""A readable decoder-only transformer (Qwen2 / Llama family) with a static, slotted KV cache.

Read top to bottom in the order of the math: config → weights → RMSNorm → RoPE → attention →
MLP → the model with its cache (prefill of new requests, one batched decode step).

The KV cache has one row ("slot") per running request:

    k_cache, v_cache: [n_layers, n_slots, n_kv_heads, context_len, head_dim]

The engine keeps the running requests in slots ``0 .. n_active-1`` (it compacts the cache when a
request leaves), so the decode step reads the cache through plain views — no gather and no copy of
the whole cache per step. Decode attention (`realhf.impl.inference.decode_attention`) reads each
slot's own columns ``0 .. position``: a small C loop where a compiler is available, else batched
matmuls over the columns ``0 .. max(position)`` with a per-slot mask for the shorter rows.

Only safetensors are read (never pickle). Anything this file does not implement — another
architecture, sliding windows, an exotic RoPE scaling — is refused with an error naming it rather
than silently computing something else.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from realhf.base.memory_budget import check_device_fits
from realhf.impl.inference.decode_attention import decode_mask, resolve_attention, torch_decode_attention

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def read_hf_config(model_path: str) -> dict:
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no config.json in model directory {model_path!r}")
    with open(path) as f:
        return json.load(f)


def eos_ids_from_config(cfg: dict) -> List[int]:
    """EOS may be an int, a list or absent; generation_config.json is not consulted on purpose:
    the trainer writes config.json, so that is the one source of truth."""
    eos = cfg.get("eos_token_id")
    if eos is None:
        return []
    if isinstance(eos, int):
        return [eos]
    return [int(e) for e in eos]


@dataclass
class ModelArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: Optional[dict]
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    eos_token_ids: List[int] = field(default_factory=list)

    @classmethod
    def from_hf_config(cls, cfg: dict) -> "ModelArgs":
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise NotImplementedError(
                f"the static-KV engine supports model_type {SUPPORTED_MODEL_TYPES}, got "
                f"model_type={model_type!r}; use the 'hf' engine kind for other architectures"
            )
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise NotImplementedError(f"{model_type}: hidden_act={act!r} is not supported (only 'silu')")
        if cfg.get("use_sliding_window", False):
            raise NotImplementedError(f"{model_type}: use_sliding_window=true is not supported")

        # transformers ≥5 writes RoPE settings as `rope_parameters`; older files use
        # `rope_theta` + `rope_scaling`. Accept both.
        rope_params = cfg.get("rope_parameters") or {}
        rope_theta = float(rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope_params.get("rope_type", "default") != "default":
            rope_scaling = rope_params
        if rope_scaling is not None:
            rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise NotImplementedError(
                    f"{model_type}: rope scaling type {rope_type!r} is not supported "
                    f"(supported: {SUPPORTED_ROPE_TYPES})"
                )
            if rope_type == "default":
                rope_scaling = None

        n_heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        head_dim = cfg.get("head_dim") or hidden // n_heads
        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        else:
            qkv_bias = o_bias = bool(cfg.get("attention_bias", False))
            mlp_bias = bool(cfg.get("mlp_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(head_dim),
            intermediate_size=int(cfg["intermediate_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=eos_ids_from_config(cfg),
        )

    def shape_signature(self) -> tuple:
        """What must match for new weights to fit the running engine's cache and buffers."""
        return (
            self.model_type,
            self.vocab_size,
            self.hidden_size,
            self.n_layers,
            self.n_heads,
            self.n_kv_heads,
            self.head_dim,
            self.intermediate_size,
        )


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def load_safetensors_dir(model_path: str) -> Dict[str, torch.Tensor]:
    """All tensors of every *.safetensors file in the directory (sharded checkpoints included)."""
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(model_path) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_path!r} (only safetensors checkpoints are loaded)")
    tensors: Dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(load_file(os.path.join(model_path, name), device="cpu"))
    return tensors


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    w_qkv: torch.Tensor  # q, k and v projections stacked: one matmul instead of three
    b_qkv: Optional[torch.Tensor]
    w_o: torch.Tensor
    b_o: Optional[torch.Tensor]
    mlp_norm: torch.Tensor
    w_gate_up: torch.Tensor  # gate and up stacked for the same reason
    b_gate_up: Optional[torch.Tensor]
    w_down: torch.Tensor
    b_down: Optional[torch.Tensor]


@dataclass
class Weights:
    embed: torch.Tensor
    layers: List[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor


def build_weights(
    args: ModelArgs, tensors: Dict[str, torch.Tensor], dtype: torch.dtype, device: Optional[torch.device] = None
) -> Weights:
    """The checkpoint's tensors in `dtype` on `device` (None: where they are, the CPU)."""

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise KeyError(f"{args.model_type} checkpoint is missing tensor {name!r}")
        return tensors[name].to(device=device, dtype=dtype)

    def maybe(name: str, present: bool) -> Optional[torch.Tensor]:
        return take(name) if present else None

    def cat(parts: Sequence[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
        return None if parts[0] is None else torch.cat(list(parts), dim=0).contiguous()

    layers = []
    for i in range(args.n_layers):
        p = f"model.layers.{i}."
        qkv = [f"{p}self_attn.{n}_proj" for n in ("q", "k", "v")]
        gu = [f"{p}mlp.{n}_proj" for n in ("gate", "up")]
        layers.append(
            LayerWeights(
                attn_norm=take(p + "input_layernorm.weight"),
                w_qkv=cat([take(n + ".weight") for n in qkv]),
                b_qkv=cat([maybe(n + ".bias", args.qkv_bias) for n in qkv]),
                w_o=take(p + "self_attn.o_proj.weight"),
                b_o=maybe(p + "self_attn.o_proj.bias", args.o_bias),
                mlp_norm=take(p + "post_attention_layernorm.weight"),
                w_gate_up=cat([take(n + ".weight") for n in gu]),
                b_gate_up=cat([maybe(n + ".bias", args.mlp_bias) for n in gu]),
                w_down=take(p + "mlp.down_proj.weight"),
                b_down=maybe(p + "mlp.down_proj.bias", args.mlp_bias),
            )
        )
    embed = take("model.embed_tokens.weight")
    # Tied embeddings: checkpoints usually omit lm_head.weight altogether.
    lm_head = take("lm_head.weight") if "lm_head.weight" in tensors else embed
    if lm_head is embed and not args.tie_word_embeddings:
        raise KeyError(f"{args.model_type} checkpoint has no 'lm_head.weight' and tie_word_embeddings is false")
    return Weights(embed=embed, layers=layers, final_norm=take("model.norm.weight"), lm_head=lm_head)


def load_model(model_path: str, dtype: torch.dtype, device: Optional[torch.device] = None) -> tuple[ModelArgs, Weights]:
    """Config and weights of a model directory; read into host memory, then moved to `device`."""
    args = ModelArgs.from_hf_config(read_hf_config(model_path))
    return args, build_weights(args, load_safetensors_dir(model_path), dtype, device)


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32:
        # torch's own op: the formula below with fewer dispatches (≈30% faster per call here).
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # Variance in fp32 even for bf16 activations, as the HF reference does.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq.float()
    rope_type = scaling.get("rope_type", scaling.get("type"))
    factor = float(scaling["factor"])
    if rope_type == "linear":
        # Positions divided by `factor` ≡ frequencies divided by it.
        return (inv_freq / factor).float()
    # llama3: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_ctx = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    smooth = ((old_ctx / wavelen) - low) / (high - low)
    interpolated = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
    in_band = (wavelen <= old_ctx / low) & (wavelen >= old_ctx / high)
    return torch.where(in_band, interpolated, out).float()


def rope_tables(args: ModelArgs, n_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and *signed* sin for every position, [n_positions, head_dim], in HF's half-rotation
    layout: HF rotates x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁]; keeping the
    sign in the table (sin → [−sin₁, sin₂]) makes the rotation a plain swap of the halves."""
    inv_freq = rope_inv_freq(args)
    freqs = torch.outer(torch.arange(n_positions, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    half = emb.shape[-1] // 2
    signed_sin = torch.cat([-emb[:, :half].sin(), emb[:, half:].sin()], dim=-1)
    return emb.cos().to(dtype), signed_sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [..., heads, head_dim]; cos/signed_sin broadcast over the heads axis. Bit for bit HF's
    x·cos + [−x₂, x₁]·sin (a sign flip is exact)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def mlp(x: torch.Tensor, lw: LayerWeights) -> torch.Tensor:
    gate, up = F.linear(x, lw.w_gate_up, lw.b_gate_up).chunk(2, dim=-1)
    # In place: both halves are views of a fresh tensor that nothing else holds.
    return F.linear(F.silu(gate, inplace=True).mul_(up), lw.w_down, lw.b_down)


# --------------------------------------------------------------------------------------------
# The model with its slotted KV cache
# --------------------------------------------------------------------------------------------


def check_cache_fits(shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """A KV cache larger than the device's free memory (a GPU's: this process's share of it) fails
    here, naming the settings that size it, rather than as an allocator error (a 30-layer model
    at its 8192-token context and 256 slots asks for tens of GB)."""
    n_layers, n_slots, _, context_len, _ = shape
    need = 2 * math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    check_device_fits(
        f"the KV cache of {n_slots} slots x {context_len} tokens x {n_layers} layers",
        need,
        device,
        "lower gen_server.native.context_length (0 = the model's max_position_embeddings) or "
        "gen_server.native.max_running_requests"
        + ("; on a GPU shared with the trainer, raise cluster.gen_memory_fraction" if device.type == "cuda" else ""),
    )


class StaticKVTransformer:
    """Forward passes for prefill and decode, writing keys/values into per-slot cache rows.

    Runs on the device its weights are on: the cache, the RoPE tables and every tensor a step
    creates go there too."""

    def __init__(
        self,
        args: ModelArgs,
        weights: Weights,
        n_slots: int,
        context_len: int,
        dtype: torch.dtype,
        attention: str = "auto",
    ):
        if context_len > args.max_position_embeddings:
            raise ValueError(
                f"context length {context_len} exceeds the model's max_position_embeddings "
                f"{args.max_position_embeddings}"
            )
        self.device = device = weights.embed.device
        # Decode attention: the C kernel when it builds here (fp32, CPU), else batched torch
        # matmuls. Decided first: a kernel refused on this device must fail before the cache exists.
        self.attention_kernel = resolve_attention(attention, dtype, device)
        self.args = args
        self.weights = weights
        self.dtype = dtype
        self.n_slots = n_slots
        self.context_len = context_len
        self.scale = 1.0 / math.sqrt(args.head_dim)
        # Computed on the host and moved: the same table values on every device.
        self.cos, self.signed_sin = (t.to(device) for t in rope_tables(args, context_len, dtype))  # [C, d]
        shape = (args.n_layers, n_slots, args.n_kv_heads, context_len, args.head_dim)
        check_cache_fits(shape, dtype, device)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def vocab_size(self) -> int:
        return self.args.vocab_size

    def set_weights(self, weights: Weights) -> None:
        self.weights = weights

    def _qkv_with_rope(self, x: torch.Tensor, lw: LayerWeights, cos: torch.Tensor, signed_sin: torch.Tensor):
        """q [..., heads, d] and k, v [..., kv_heads, d] of hidden states x, RoPE applied to q and k
        (in one call: their heads sit side by side in the projection's output)."""
        a = self.args
        qkv = F.linear(x, lw.w_qkv, lw.b_qkv).view(*x.shape[:-1], a.n_heads + 2 * a.n_kv_heads, a.head_dim)
        qk = apply_rope(qkv[..., : a.n_heads + a.n_kv_heads, :], cos, signed_sin)
        q, k = qk.split([a.n_heads, a.n_kv_heads], dim=-2)
        return q, k, qkv[..., a.n_heads + a.n_kv_heads :, :]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        h = rms_norm(h, self.weights.final_norm, self.args.rms_norm_eps)
        return F.linear(h, self.weights.lm_head).float()

    @torch.inference_mode()
    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Run right-padded prompts [b, P] into cache rows `slots`; logits [b, vocab] at each last
        real token. Padding after a prompt never reaches its real tokens (causal attention), and
        the cache columns it fills are masked out and overwritten by later decode steps."""
        a, w = self.args, self.weights
        b, P = tokens.shape
        cos, sin = self.cos[:P, None, :], self.signed_sin[:P, None, :]
        # The engine admits into consecutive slots: then a slice makes the cache write a plain copy.
        s0 = int(slots[0])
        rows = slice(s0, s0 + b) if bool((slots == torch.arange(s0, s0 + b, device=slots.device)).all()) else slots
        x = F.embedding(tokens, w.embed)  # [b, P, hidden]
        for li, lw in enumerate(w.layers):
            h = rms_norm(x, lw.attn_norm, a.rms_norm_eps)
            q, k, v = self._qkv_with_rope(h, lw, cos, sin)  # [b, P, heads, head_dim]
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, P, d]
            self.k_cache[li, rows, :, :P] = k
            self.v_cache[li, rows, :, :P] = v
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=True)
            x = x + F.linear(att.transpose(1, 2).reshape(b, P, -1), lw.w_o, lw.b_o)
            x = x + mlp(rms_norm(x, lw.mlp_norm, a.rms_norm_eps), lw)
        last = x[torch.arange(b, device=self.device), lengths - 1]  # only the last real token needs logits
        return self._logits(last)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token for each of the slots 0..n-1 (n = len(tokens)) at `positions`; logits [n, vocab]."""
        a, w = self.args, self.weights
        n = tokens.shape[0]
        T = int(positions.max()) + 1  # slot b attends over its columns 0..positions[b] <= T-1
        if n > self.n_slots or T > self.context_len:
            raise ValueError(
                f"decode: {n} slots up to position {T - 1} do not fit the cache "
                f"({self.n_slots} slots x {self.context_len} columns)"
            )
        cos, sin = self.cos[positions, None, :], self.signed_sin[positions, None, :]  # [n, 1, d]
        kernel = self.attention_kernel
        if kernel is not None:
            lens = positions + 1
        else:
            # Where each slot's new key/value goes, with a layer's cache seen as rows of head_dim.
            kv_heads = torch.arange(a.n_kv_heads, device=self.device)
            cache_rows = (
                (torch.arange(n, device=self.device)[:, None] * a.n_kv_heads + kv_heads) * self.context_len
                + positions[:, None]
            ).flatten()
            mask = decode_mask(positions, T, self.dtype)
        x = F.embedding(tokens, w.embed)  # [n, hidden]
        for li, lw in enumerate(w.layers):
            h = rms_norm(x, lw.attn_norm, a.rms_norm_eps)
            q, k, v = self._qkv_with_rope(h, lw, cos, sin)  # [n, heads, d]
            if kernel is not None:  # writes k, v into the cache itself
                att = kernel(q, k, v, self.k_cache[li], self.v_cache[li], lens, T, self.scale)
            else:
                self.k_cache[li].view(-1, a.head_dim).index_copy_(0, cache_rows, k.reshape(-1, a.head_dim))
                self.v_cache[li].view(-1, a.head_dim).index_copy_(0, cache_rows, v.reshape(-1, a.head_dim))
                att = torch_decode_attention(q, self.k_cache[li], self.v_cache[li], mask, self.scale)
            x = x + F.linear(att.reshape(n, -1), lw.w_o, lw.b_o)
            x = x + mlp(rms_norm(x, lw.mlp_norm, a.rms_norm_eps), lw)
        return self._logits(x)

    @torch.inference_mode()
    def move_slots(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy cache rows src → dst (columns < length), used to keep running slots contiguous."""
        if len(src) == 0:
            return
        self.k_cache[:, dst, :, :length] = self.k_cache[:, src, :, :length]
        self.v_cache[:, dst, :, :length] = self.v_cache[:, src, :, :length]
