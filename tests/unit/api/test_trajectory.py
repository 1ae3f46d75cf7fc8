"""The trajectory message (docs/architecture.md §6): round trip, and every malformed field refused by name."""

import re

import pytest

from realhf.api.trajectory import Sample, Trajectory, TrajectoryFormatError
from realhf.base import serialization


def _msg():
    t = Trajectory("q1", [1, 2, 3], [Sample([4, 5], [-0.5, -0.25], [3, 4], 1.0)], birth_time=12.5, metadata={"k": "v"})
    return serialization.loads(serialization.dumps(t.to_msg()))


def test_a_trajectory_survives_msgpack_and_validation():
    t = Trajectory.from_msg(_msg())
    assert (t.qid, t.prompt_ids.tolist(), t.birth_time, t.metadata) == ("q1", [1, 2, 3], 12.5, {"k": "v"})
    assert t.samples[0].output_ids.tolist() == [4, 5] and t.samples[0].versions.tolist() == [3, 4]


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("birth_time", [1], "birth_time: must be a finite number"),
        ("birth_time", float("nan"), "birth_time: must be a finite number"),
        ("metadata", [1, 2], "metadata: must be a map"),
        ("task", 3, "task: must be a string"),
        ("prompt_ids", [1, "x"], "prompt_ids: expected a 1-d array or list of ints"),
        ("prompt_ids", [1, True], "prompt_ids: expected a 1-d array or list of ints"),
        ("prompt_ids", [1, 2**40], "prompt_ids: values outside the int32 range"),
    ],
)
def test_malformed_fields_are_refused_naming_the_field(field, value, says):
    msg = _msg()
    msg[field] = value
    with pytest.raises(TrajectoryFormatError, match=says):
        Trajectory.from_msg(msg)


def test_token_fields_travel_as_typed_arrays_and_plain_lists_are_accepted_too():
    import numpy as np

    t = Trajectory("q1", [1, 2], [Sample([4, 5], [-0.5, -0.25], [3, 4], 1.0, loss_mask=[1, 0])])
    msg = t.to_msg()
    s = msg["samples"][0]
    assert s["output_ids"].dtype == np.int32 and s["logprobs"].dtype == np.float32 and s["loss_mask"].dtype == np.int32
    as_lists = dict(
        msg, prompt_ids=[1, 2], samples=[{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in s.items()}]
    )
    for m in (serialization.loads(serialization.dumps(msg)), as_lists):
        back = Trajectory.from_msg(m)
        s0 = back.samples[0]
        assert s0.output_ids.dtype == np.int32 and s0.logprobs.dtype == np.float32
        assert s0.output_ids.tolist() == [4, 5] and s0.loss_mask.tolist() == [1, 0]
        assert s0.logprobs.tolist() == [-0.5, -0.25] and back.prompt_ids.tolist() == [1, 2]


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("output_ids", "float", "output_ids: expected a 1-d array or list of ints"),
        ("output_ids", "2d", "output_ids: expected a 1-d array or list of ints"),
        ("logprobs", "inf", "logprobs: every entry must be a finite number"),
        ("logprobs", "text", "logprobs: expected a 1-d array or list of numbers"),
        ("reward", "nan", "reward: must be a finite number"),
        ("versions", "short", "versions: 1 entries for 2 output tokens"),
    ],
)
def test_malformed_arrays_are_refused_naming_the_field(field, value, says):
    import numpy as np

    arrays = {
        "float": np.array([1.0, 2.0]),
        "2d": np.array([[4, 5]]),
        "inf": np.array([-1.0, np.inf], np.float32),
        "short": np.array([3]),
        "text": ["a", "b"],
        "nan": float("nan"),
    }
    msg = _msg()
    msg["samples"][0][field] = arrays[value]
    with pytest.raises(TrajectoryFormatError, match=says):
        Trajectory.from_msg(msg)


def test_received_arrays_are_used_without_a_copy():
    import numpy as np

    msg = _msg()
    received = msg["samples"][0]["output_ids"]
    t = Trajectory.from_msg(msg)
    assert np.shares_memory(t.samples[0].output_ids, received)


def test_staleness_counts_only_trained_tokens():
    t = Trajectory(
        "q", [1], [Sample([4, 5, 6], [0.0] * 3, [1, 5, 7], 0.0, loss_mask=[0, 1, 1]), Sample([4], [0.0], [3], 0.0)]
    )
    assert (t.version_start, t.version_end, t.n_generated_tokens) == (3, 7, 3)


def test_an_all_trained_sample_travels_without_a_mask_and_comes_back_all_ones():
    t = Trajectory("q", [1], [Sample([4, 5], [-0.5, -0.25], [3, 3], 1.0), Sample([6], [-1.0], [3], 0.0, loss_mask=[0])])
    msg = serialization.loads(serialization.dumps(t.to_msg()))
    assert "loss_mask" not in msg["samples"][0] and msg["samples"][1]["loss_mask"].tolist() == [0]
    back = Trajectory.from_msg(msg)
    assert back.samples[0].loss_mask.tolist() == [1, 1] and back.samples[1].loss_mask.tolist() == [0]


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda t: setattr(t.samples[0], "reward", float("nan")), r"samples\[0\].reward is nan"),
        (lambda t: setattr(t.samples[0], "reward", float("-inf")), r"samples\[0\].reward is -inf"),
        # Finite as a float64, infinite as the float32 it becomes (and its square overflows long before).
        (lambda t: setattr(t.samples[0], "reward", 1e39), r"samples\[0\].reward is 1e\+39, beyond ±1e\+15"),
        (lambda t: setattr(t.samples[0], "reward", -2e15), r"samples\[0\].reward is -2000000000000000.0, beyond"),
        (lambda t: setattr(t, "samples", []), "no samples"),
        (lambda t: t.samples.append(Sample([], [], [], 0.0)), r"samples\[1\] has no generated tokens"),
    ],
)
def test_a_group_the_trainer_would_refuse_is_named_by_problem_and_refused_by_from_msg(change, says):
    t = Trajectory.from_msg(_msg())
    assert t.problem() is None
    change(t)
    assert re.search(says, t.problem())
    with pytest.raises(TrajectoryFormatError):  # the receiver's check agrees with the sender's
        Trajectory.from_msg(serialization.loads(serialization.dumps(t.to_msg())))


# ---- an agent's own numbers (Outcome.info → Sample.metrics, issue 29 item 2) --------------------


def test_a_samples_metrics_travel_and_come_back_as_floats():
    t = Trajectory("q", [1], [Sample([4], [-0.5], [0], 1.0, metrics={"turns": 2, "solved": True, "x.y-z": 0.5})])
    back = Trajectory.from_msg(serialization.loads(serialization.dumps(t.to_msg())))
    assert back.samples[0].metrics == {"turns": 2.0, "solved": 1.0, "x.y-z": 0.5}
    assert "metrics" not in Trajectory("q", [1], [Sample([4], [-0.5], [0], 1.0)]).to_msg()["samples"][0]


@pytest.mark.parametrize(
    "metrics, says",
    [
        ({"note": "hello"}, "note='hello' is not a finite number"),
        ({"x": float("nan")}, "x=nan is not a finite number"),
        ({"bad name": 1}, "name 'bad name' is not a metric name"),
        ({f"m{i}": i for i in range(33)}, "33 entries, at most 32"),
    ],
)
def test_metrics_that_are_not_numbers_are_refused_by_the_sender_and_the_receiver(metrics, says):
    t = Trajectory("q", [1], [Sample([4], [-0.5], [0], 1.0, metrics=metrics)])
    assert says in t.problem()
    msg = serialization.loads(
        serialization.dumps({**t.to_msg(), "samples": [{**t.to_msg()["samples"][0], "metrics": metrics}]})
    )
    with pytest.raises(TrajectoryFormatError, match=re.escape("samples[0].metrics: " + says)):
        Trajectory.from_msg(msg)
