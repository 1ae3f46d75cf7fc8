"""Specification of `allocation_mode` (docs/architecture.md §8), realhf.base.allocation_mode."""

import pytest

from realhf.base.allocation_mode import AllocationMode, AllocationModeError, ParallelStrategy

# ---------------------------------------------------------------------------------------------
# Valid forms
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, engine, gen, train",
    [
        # The two examples of docs/architecture.md §8.
        ("sglang.d4p1m1+d2p2m1", "sglang", (4, 1, 1), (2, 1, 2)),
        ("native.d1m1p1+d1m1p1", "native", (1, 1, 1), (1, 1, 1)),
        # Letters in any order; (dp, tp, pp) where m is tensor parallelism.
        ("sglang.m2d3p1+p1m1d4", "sglang", (3, 2, 1), (4, 1, 1)),
        ("sglang.p2m4d1+m1p1d2", "sglang", (1, 4, 2), (2, 1, 1)),
        # Missing letters default to 1.
        ("sglang.d4+d2", "sglang", (4, 1, 1), (2, 1, 1)),
        ("sglang.m2+p3", "sglang", (1, 2, 1), (1, 1, 3)),
        ("native.d2+d1", "native", (2, 1, 1), (1, 1, 1)),
        # Multi-digit sizes and surrounding whitespace.
        ("  sglang.d16m8+d32  ", "sglang", (16, 8, 1), (32, 1, 1)),
    ],
)
def test_valid_allocation_modes_parse_into_generation_and_trainer_strategies(text, engine, gen, train):
    mode = AllocationMode.parse(text)
    assert mode.gen_engine == engine
    assert mode.gen == ParallelStrategy(*gen)
    assert mode.train == ParallelStrategy(*train)


def test_world_size_is_dp_times_tp_times_pp():
    assert ParallelStrategy(dp=2, tp=3, pp=4).world_size == 24
    assert ParallelStrategy().world_size == 1


def test_str_gives_the_canonical_form_that_parses_back():
    mode = AllocationMode.parse("sglang.p1m2d4+p2d1")
    assert str(mode) == "sglang.d4m2p1+d1m1p2"
    assert AllocationMode.parse(str(mode)) == mode


# ---------------------------------------------------------------------------------------------
# Malformed forms: each error names the field, the whole string, the bad part and the grammar
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, problem, bad_part",
    [
        ("d4m1p1+d2m1p1", "missing the '<engine>.' prefix", None),
        ("trtllm.d1+d1", "unknown engine 'trtllm'", "trtllm"),
        ("sglang.d4m1p1", "needs exactly two parts joined by '+'", "d4m1p1"),
        ("sglang.d1+d1+d1", "needs exactly two parts joined by '+'", "d1+d1+d1"),
        ("sglang.+d2", "the generation part is empty", "+d2"),
        ("sglang.d2+", "the trainer part is empty", "d2+"),
        ("sglang.d2d4+d1", "'d' appears twice in the generation part", "d2d4"),
        ("sglang.d2+d0", "d0 must be a positive integer", "d0"),
        ("sglang.d2t2+d1", "unknown parallelism letter 't' (tensor parallelism is spelled 'm')", "d2t2"),
        ("sglang.d2+x3", "unknown parallelism letter 'x' in the trainer part", "x3"),
        ("sglang.d2m+d1", "cannot read 'm' in the generation part", "d2m"),
        ("sglang.D2+d1", "cannot read 'D2' in the generation part", "D2"),
        ("sglang.d2 m1+d1", "cannot read ' m1' in the generation part", "d2 m1"),
        ("sglang.d-1+d1", "cannot read 'd-1'", "d-1"),
    ],
)
def test_malformed_allocation_modes_are_rejected_with_a_helpful_message(text, problem, bad_part):
    with pytest.raises(AllocationModeError) as info:
        AllocationMode.parse(text)
    message = str(info.value)
    if bad_part is None:
        assert message.startswith(f"allocation_mode={text!r}: {problem}")
    else:
        assert message.startswith(f"allocation_mode={text!r}: bad part {bad_part!r}: {problem}")
        assert info.value.part == bad_part
    assert "expected '<engine>.d<dp>m<tp>p<pp>+d<dp>m<tp>p<pp>'" in message
    assert info.value.field == "allocation_mode" and info.value.value == text


def test_allocation_mode_error_is_a_value_error():
    with pytest.raises(ValueError):
        AllocationMode.parse("nonsense")


def test_non_string_allocation_mode_is_rejected():
    with pytest.raises(AllocationModeError, match="must be a string"):
        AllocationMode.parse(None)


# ---------------------------------------------------------------------------------------------
# What the engines and the trainer support (the GPUs: tests/unit/base/test_placement.py)
# ---------------------------------------------------------------------------------------------


def test_default_allocation_is_valid():
    AllocationMode.parse("native.d1m1p1+d1m1p1").validate()
    AllocationMode.parse("native.d2+d4").validate()
    AllocationMode.parse("vllm.d2+d1").validate()


@pytest.mark.parametrize("text", ["vllm.m2+d1", "vllm.d2p2+d1"])
def test_vllm_servers_take_one_device_each_for_now(text):
    with pytest.raises(AllocationModeError, match="vLLM servers run on one device each for now, so they need m1 p1"):
        AllocationMode.parse(text).validate()


@pytest.mark.parametrize("text", ["native.m2+d1", "native.p2+d1"])
def test_native_engine_supports_only_tp_and_pp_one(text):
    with pytest.raises(AllocationModeError, match="native engine .* needs m1 p1"):
        AllocationMode.parse(text).validate()


@pytest.mark.parametrize(
    "text", ["native.d1+d1m2", "native.d1+d2m2p1", "sglang.d1+d4m2", "native.d1+d1p2", "native.d1+d1m2p2"]
)
def test_trainer_tensor_and_pipeline_parallelism_are_accepted(text):
    mode = AllocationMode.parse(text)
    mode.validate()
    assert mode.train.world_size == mode.train.dp * mode.train.tp * mode.train.pp


def test_sglang_tensor_parallel_generation_is_fine():
    AllocationMode.parse("sglang.d2m2+d4").validate()
