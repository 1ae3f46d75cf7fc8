"""The msgpack wire format (docs/architecture.md §6): exact round trips, clear errors, a decoder that never crashes."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from realhf.base import serialization
from realhf.base.serialization import DeserializationError, dumps, loads

NUMERIC_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


def assert_same_array(a: np.ndarray, b: np.ndarray):
    assert isinstance(b, np.ndarray)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()  # bit-exact, NaNs included


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES)
def test_every_numeric_dtype_round_trips_bit_exactly_as_a_read_only_view(dtype):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 4)) * 100).astype(dtype)
    b = loads(dumps({"a": a}))["a"]
    assert_same_array(a, b)
    with pytest.raises(ValueError, match="read-only"):
        b[...] = 0  # a view of the message, not a copy
    c = b.copy()
    c[...] = 0


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (1,), (2, 0, 5), (2, 3, 4, 1)])
def test_empty_zero_d_and_high_rank_arrays_keep_their_shape(shape):
    a = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    assert_same_array(a, loads(dumps(a)))


def test_non_contiguous_and_big_endian_arrays_round_trip_by_value():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]
    assert_same_array(np.ascontiguousarray(a), loads(dumps(a)))
    be = np.arange(5, dtype=">i4")
    out = loads(dumps(be))
    assert out.dtype == be.dtype and (out == be).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8])
def test_cpu_torch_tensors_round_trip_as_tensors(dtype):
    t = (torch.randn(3, 5) * 10).to(dtype)
    out = loads(dumps({"t": t}))["t"]
    assert isinstance(out, torch.Tensor) and out.dtype == t.dtype and out.shape == t.shape
    assert torch.equal(out, t)
    out.add_(1) if dtype not in (torch.bool,) else None  # writable


def test_nested_containers_and_scalars_round_trip():
    obj = {
        "a": [1, 2.5, None, True, "x", b"\x00\xff"],
        "b": {"c": (1, 2)},
        3: "int key",
        "np": np.float32(1.5),
        "i": np.int64(-7),
    }
    out = loads(dumps(obj))
    assert out["a"] == [1, 2.5, None, True, "x", b"\x00\xff"]
    assert out["b"] == {"c": [1, 2]}  # tuples come back as lists
    assert out[3] == "int key"
    assert out["np"] == 1.5 and out["i"] == -7


def test_unknown_type_error_names_its_path():
    with pytest.raises(TypeError) as e:
        dumps({"samples": [{"ok": 1}, {"reward": object()}]})
    assert "['samples'][1]['reward']" in str(e.value)
    assert "object" in str(e.value)


def test_object_arrays_and_gpu_like_types_are_refused():
    with pytest.raises(TypeError, match=r"obj\['x'\]"):
        dumps({"x": np.array([object()], dtype=object)})
    with pytest.raises(TypeError):
        dumps({1, 2})  # sets are not part of the format


def test_foreign_or_forged_payloads_raise_the_documented_error():
    import pickle

    import msgpack

    with pytest.raises(DeserializationError):
        loads(pickle.dumps({"a": 1}))
    # An array header promising more bytes than it carries.
    forged = msgpack.packb(msgpack.ExtType(1, msgpack.packb({"dtype": "<f8", "shape": [10], "data": b"\x00" * 8})))
    with pytest.raises(DeserializationError, match="needs 80 bytes"):
        loads(forged)
    # Object dtype smuggled in an array header.
    forged = msgpack.packb(msgpack.ExtType(1, msgpack.packb({"dtype": "|O", "shape": [1], "data": b"\x00" * 8})))
    with pytest.raises(DeserializationError):
        loads(forged)
    with pytest.raises(DeserializationError, match="extension type 99"):
        loads(msgpack.packb(msgpack.ExtType(99, b"")))
    with pytest.raises(DeserializationError):
        loads("not bytes")


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_property_plain_values_round_trip(obj):
    assert loads(dumps(obj)) == obj


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(
        dtype=st.sampled_from(NUMERIC_DTYPES).map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_property_arrays_round_trip_bit_exactly(a):
    assert_same_array(a, loads(dumps({"x": [a]}))["x"][0])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_property_random_bytes_never_crash_the_decoder(data):
    try:
        loads(data)
    except DeserializationError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=64), st.integers(min_value=0))
def test_property_corrupted_valid_messages_fail_only_through_the_documented_error(noise, pos):
    good = bytearray(dumps({"ids": np.arange(6, dtype=np.int64), "r": math.pi, "t": "x"}))
    p = pos % len(good)
    good[p : p + len(noise)] = noise
    try:
        loads(bytes(good))
    except DeserializationError:
        pass


def test_module_exports_only_the_documented_api():
    assert set(serialization.__all__) == {"dumps", "loads", "DeserializationError"}
