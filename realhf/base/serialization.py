"""The one wire format of realhf: msgpack, never pickle.

Supported values: nested dicts / lists / tuples of None, bool, int, float, str, bytes, numpy
arrays of any numeric, bool or datetime dtype and shape, CPU torch tensors, and numpy scalars.
Arrays and tensors travel as msgpack extension types whose payload is the map
`{dtype, shape, data}` (docs/architecture.md §6), so any msgpack reader can decode them.

Round-trip rules: arrays and tensors come back with the same dtype, shape and bytes; numpy
arrays are read-only views of the received message (no copy: a trajectory's token arrays are
most of its bytes; `.copy()` to modify), tensors are writable; tuples come back as lists; numpy
scalars come back as Python scalars.
"""

import math
from typing import Any, Dict, List

import msgpack
import numpy as np

__all__ = ["dumps", "loads", "DeserializationError"]

_EXT_NDARRAY = 1
_EXT_TORCH = 2

# numpy has no bfloat16; such tensors travel as their raw 16-bit patterns.
_TORCH_ONLY_DTYPES = {"bfloat16"}


class DeserializationError(ValueError):
    """Raised by `loads` for any input that is not a valid realhf message."""


def _torch():
    import torch  # imported lazily: rollout workers and the manager never need it

    return torch


def _is_torch_tensor(obj) -> bool:
    return type(obj).__module__.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter")


def _pack_array(arr: np.ndarray) -> bytes:
    if arr.dtype.kind in "OVU" or arr.dtype.hasobject:
        raise TypeError(f"numpy dtype {arr.dtype} cannot be serialized")
    # A C-contiguous array is packed straight from its memory (one copy fewer than tobytes);
    # tobytes() handles the rest (strided views, 0-d and empty arrays) in C order.
    if arr.flags.c_contiguous and arr.size > 0:
        data = memoryview(arr).cast("B")
    else:
        data = arr.tobytes(order="C")
    return msgpack.packb({"dtype": arr.dtype.str, "shape": list(arr.shape), "data": data})


def _default(obj):
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(_EXT_NDARRAY, _pack_array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if _is_torch_tensor(obj):
        torch = _torch()
        t = obj.detach()
        if t.device.type != "cpu":
            raise TypeError(f"only CPU tensors can be serialized, got one on {t.device}")
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            payload = {"dtype": "bfloat16", "shape": list(t.shape), "data": t.view(torch.int16).numpy().tobytes()}
            return msgpack.ExtType(_EXT_TORCH, msgpack.packb(payload))
        return msgpack.ExtType(_EXT_TORCH, _pack_array(t.numpy()))
    raise TypeError(f"type {type(obj).__name__} cannot be serialized")


def _find_unsupported(obj, path: str) -> str:
    """Path of the first value msgpack cannot encode, e.g. `obj['a'][2]` (only on failure)."""
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, bytearray)):
        return ""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, (str, int, bytes, bool)) and k is not None:
                return f"{path} (key {k!r} of type {type(k).__name__})"
            found = _find_unsupported(v, f"{path}[{k!r}]")
            if found:
                return found
        return ""
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = _find_unsupported(v, f"{path}[{i}]")
            if found:
                return found
        return ""
    try:
        _default(obj)
    except TypeError as e:
        return f"{path} ({e})"
    return ""


def dumps(obj: Any) -> bytes:
    """Encode `obj`; raises TypeError naming where in `obj` an unsupported value sits."""
    try:
        return msgpack.packb(obj, default=_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        where = _find_unsupported(obj, "obj") or "obj"
        raise TypeError(f"cannot serialize {where}") from None


def _unpack_array_payload(payload: bytes):
    # Called once per array of every message: plain loops and exact type checks, no generators.
    meta = msgpack.unpackb(payload, raw=False)
    try:
        dtype, shape, data = meta["dtype"], meta["shape"], meta["data"]
    except (TypeError, KeyError, IndexError):
        raise DeserializationError("array payload must be a map {dtype, shape, data}") from None
    if len(meta) != 3:
        raise DeserializationError("array payload must be a map {dtype, shape, data}")
    if type(dtype) is not str or type(shape) is not list or type(data) is not bytes:
        raise DeserializationError("array payload has fields of the wrong type")
    for s in shape:
        if type(s) is not int or s < 0:
            raise DeserializationError(f"invalid array shape {shape!r}")
    return dtype, shape, data


_DTYPE_CACHE: Dict[str, np.dtype] = {}


def _dtype(dtype_str: str) -> np.dtype:
    dtype = _DTYPE_CACHE.get(dtype_str)
    if dtype is None:
        try:
            dtype = np.dtype(dtype_str)
        except TypeError:
            raise DeserializationError(f"unknown dtype {dtype_str!r}") from None
        if dtype.kind in "OVU" or dtype.hasobject:
            raise DeserializationError(f"dtype {dtype_str!r} is not allowed")
        if len(_DTYPE_CACHE) < 256:  # bounded: a foreign sender could invent endless spellings
            _DTYPE_CACHE[dtype_str] = dtype
    return dtype


def _to_array(dtype_str: str, shape: List[int], data: bytes, writable: bool = False) -> np.ndarray:
    dtype = _dtype(dtype_str)
    n = math.prod(shape)
    if n * dtype.itemsize != len(data):
        raise DeserializationError(
            f"array of shape {shape} and dtype {dtype_str} needs {n * dtype.itemsize} bytes, got {len(data)}"
        )
    # np.frombuffer over bytes is a read-only view; bytearray (a copy) makes it writable.
    return np.frombuffer(bytearray(data) if writable else data, dtype=dtype).reshape(shape)


def _ext_hook(code: int, payload: bytes):
    if code == _EXT_NDARRAY:
        dtype_str, shape, data = _unpack_array_payload(payload)
        dtype = _DTYPE_CACHE.get(dtype_str) or _dtype(dtype_str)
        if math.prod(shape) * dtype.itemsize != len(data):
            return _to_array(dtype_str, shape, data)  # raises, naming the sizes
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if code == _EXT_TORCH:
        dtype, shape, data = _unpack_array_payload(payload)
        torch = _torch()
        if dtype in _TORCH_ONLY_DTYPES:
            return torch.from_numpy(_to_array("<i2", shape, data, writable=True)).view(torch.bfloat16)
        return torch.from_numpy(_to_array(dtype, shape, data, writable=True))
    raise DeserializationError(f"unknown msgpack extension type {code}")


def loads(data: bytes) -> Any:
    """Decode a message made by `dumps`.

    Raises `DeserializationError` (and nothing else) for malformed or foreign input.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DeserializationError(f"expected bytes, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False, use_list=True)
    except DeserializationError:
        raise
    except Exception as e:  # msgpack raises a zoo of types for corrupt input
        raise DeserializationError(f"malformed message ({type(e).__name__}: {e})") from None
