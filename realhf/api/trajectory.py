"""The trajectory message: one finished prompt group, rollout worker → trainer (docs/architecture.md §6).

On the wire it is a plain msgpack map (`to_msg` / `from_msg`), never a pickled object:

    {qid, task, prompt_ids, birth_time, metadata,
     samples: [{output_ids, logprobs, versions, loss_mask, no_eos, reward}, ...]}

with the token-level fields as numpy arrays (int32 ids, versions and mask, float32 log-probs),
in the message and in the `Sample` objects at both ends, so nothing is converted per token on
the way; `from_msg` also accepts plain lists from other senders.

`output_ids` holds everything after the prompt. Tokens the agent inserted itself (an
environment's feedback turn in a multi-turn episode) are in `output_ids` with `loss_mask` 0,
behaviour log-prob 0 and the version of the surrounding generation; generated tokens have
`loss_mask` 1; a sample whose tokens are all trained on travels without `loss_mask` (most
samples: one array fewer to pack and unpack). `from_msg` validates a received message and says which field is wrong, so a
malformed message is rejected at the receiver instead of failing inside the trainer.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np


class TrajectoryFormatError(ValueError):
    pass


_INT32 = np.iinfo(np.int32)
# Rewards become float32 tensors, and the advantage estimators square them (a group's variance,
# a step's): beyond this bound a sum of squares over a large step overflows float32 (max 3.4e38)
# and the whole optimizer step is skipped as non-finite, good groups with it. 1e15 leaves room
# for 1e8 samples; no reward a task means to give is anywhere near it.
MAX_ABS_REWARD = 1e15


MAX_SAMPLE_METRICS = 32  # an agent's numbers per sample (Outcome.info)
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")  # safe as a metrics key in every sink


def metrics_problem(metrics: Any) -> Optional[str]:
    """Why a sample's `metrics` (an agent's Outcome.info) cannot travel and be logged, or None:
    at most MAX_SAMPLE_METRICS names of letters, digits, `_ . -` mapping to finite numbers within
    ±MAX_ABS_REWARD (bools count as 0/1)."""
    if not isinstance(metrics, dict):
        return f"must be a map of names to numbers, got {type(metrics).__name__}"
    if len(metrics) > MAX_SAMPLE_METRICS:
        return f"{len(metrics)} entries, at most {MAX_SAMPLE_METRICS}"
    for k, v in metrics.items():
        if not isinstance(k, str) or not METRIC_NAME.match(k):
            return f"name {k!r:.80} is not a metric name (letters, digits, '_', '.', '-'; at most 64)"
        if not isinstance(v, (int, float)) or isinstance(v, float) and not math.isfinite(v) or abs(v) > MAX_ABS_REWARD:
            return f"{k}={v!r:.80} is not a finite number within ±{MAX_ABS_REWARD:g} (only numbers reach the metrics)"
    return None


def reward_problem(reward: Any) -> Optional[str]:
    """Why `reward` cannot be trained on, or None."""
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        return f"is {reward!r}, not a number"
    if not math.isfinite(reward):
        return f"is {reward!r}, not a finite number"
    if abs(reward) > MAX_ABS_REWARD:
        return f"is {reward!r}, beyond ±{MAX_ABS_REWARD:g} (float32 statistics of such rewards overflow)"
    return None


def _as_array(values: Any, strict: bool) -> Optional[np.ndarray]:
    if isinstance(values, np.ndarray):
        return values
    if not isinstance(values, (list, tuple)):
        return None
    # numpy would read True as 1: in a received list that is a malformed field. (A scan costs
    # more than the conversion, so lists built locally skip it.)
    if strict and any(isinstance(v, bool) for v in values):
        return None
    try:
        return np.asarray(values)
    except (ValueError, TypeError):  # ragged nesting
        return None


def _array_1d(values: Any, where: str, kinds: str, what: str, empty_dtype, strict: bool) -> np.ndarray:
    if isinstance(values, (list, tuple)) and not values:
        return np.zeros(0, dtype=empty_dtype)
    arr = _as_array(values, strict)
    if arr is None or arr.ndim != 1 or arr.dtype.kind not in kinds:
        got = type(values).__name__ if arr is None else f"{arr.dtype} of shape {arr.shape}"
        raise TrajectoryFormatError(f"trajectory {where}: expected a 1-d array or list of {what}, got {got}")
    return arr


def _int_array(values: Any, where: str, strict: bool = False) -> np.ndarray:
    """`values` (an integer array or a list of ints) as a 1-d int32 array; no copy when it already is one."""
    if isinstance(values, np.ndarray) and values.dtype == np.int32 and values.ndim == 1:
        return values
    arr = _array_1d(values, where, "iu", "ints", np.int32, strict)
    if arr.size and (arr.min() < _INT32.min or arr.max() > _INT32.max):
        raise TrajectoryFormatError(f"trajectory {where}: values outside the int32 range")
    return arr.astype(np.int32, copy=False)


def _float_array(values: Any, where: str, strict: bool = False) -> np.ndarray:
    """`values` as a 1-d float32 array of finite numbers; no copy when it already is one."""
    arr = _array_1d(values, where, "fiu", "numbers", np.float32, strict).astype(np.float32, copy=False)
    if not np.isfinite(arr).all():
        raise TrajectoryFormatError(f"trajectory {where}: every entry must be a finite number")
    return arr


@dataclass(eq=False)
class Sample:
    """One answer. Token-level fields are 1-d numpy arrays (lists are converted on construction):
    int32 `output_ids`, `versions` and `loss_mask`, float32 `logprobs`."""

    output_ids: np.ndarray
    logprobs: np.ndarray  # behaviour log-prob of each output token
    versions: np.ndarray  # weight version that produced each output token
    reward: float
    no_eos: bool = False  # True when the answer was cut at max_new_tokens
    loss_mask: Optional[np.ndarray] = None  # None on construction: every output token is trained on
    metrics: Dict[str, float] = field(default_factory=dict)  # the agent's numbers (Outcome.info), per sample

    def __post_init__(self):
        self.output_ids = _int_array(self.output_ids, "sample.output_ids")
        n = len(self.output_ids)
        self.logprobs = _float_array(self.logprobs, "sample.logprobs")
        self.versions = _int_array(self.versions, "sample.versions")
        self.loss_mask = (
            np.ones(n, dtype=np.int32) if self.loss_mask is None else _int_array(self.loss_mask, "sample.loss_mask")
        )
        for name in ("logprobs", "versions", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise TrajectoryFormatError(
                    f"trajectory sample.{name}: {len(getattr(self, name))} entries for {n} output tokens"
                )

    @classmethod
    def _checked(cls, output_ids, logprobs, versions, reward, no_eos, loss_mask, metrics=None) -> "Sample":
        """A Sample of fields `from_msg` has already checked (skips `__post_init__`: receiving
        a group builds thousands of these per second)."""
        s = cls.__new__(cls)
        s.output_ids, s.logprobs, s.versions, s.reward, s.no_eos = output_ids, logprobs, versions, reward, no_eos
        s.loss_mask = np.ones(len(output_ids), dtype=np.int32) if loss_mask is None else loss_mask
        s.metrics = dict(metrics or {})
        return s

    def mask(self) -> np.ndarray:
        return self.loss_mask


@dataclass(eq=False)
class Trajectory:
    qid: str
    prompt_ids: np.ndarray  # int32; a list is converted on construction
    samples: List[Sample]
    task: str = "math"
    birth_time: float = field(default_factory=time.time)
    metadata: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.prompt_ids = _int_array(self.prompt_ids, f"{self.qid!r}.prompt_ids")

    # ---- staleness (docs/architecture.md §4) ----------------------------------------------------------------
    def _trained_versions(self) -> np.ndarray:
        parts = [s.versions[s.loss_mask != 0] for s in self.samples]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)

    @property
    def version_start(self) -> int:
        """The oldest weight version behind any generated token of the group."""
        vs = self._trained_versions()
        return int(vs.min()) if vs.size else 0

    @property
    def version_end(self) -> int:
        vs = self._trained_versions()
        return int(vs.max()) if vs.size else 0

    @property
    def n_generated_tokens(self) -> int:
        return sum(int(np.count_nonzero(s.loss_mask)) for s in self.samples)

    def problem(self) -> Optional[str]:
        """Why the trainer would refuse this group (what `from_msg` rejects), or None: the
        sender's check, so a malformed group fails its episode instead of leaking a slot."""
        if not self.samples:
            return "no samples"
        for i, s in enumerate(self.samples):
            bad = reward_problem(s.reward)
            if bad is not None:
                return f"samples[{i}].reward {bad}"
            if not np.isfinite(s.logprobs).all():
                return f"samples[{i}].logprobs has non-finite entries"
            if not len(s.output_ids):
                return f"samples[{i}] has no generated tokens"
            bad = metrics_problem(s.metrics)
            if bad is not None:
                return f"samples[{i}].metrics: {bad}"
        return None

    # ---- wire format --------------------------------------------------------------------------
    def to_msg(self) -> Dict[str, Any]:
        """Token-level fields travel as numpy arrays (one msgpack binary each, docs/architecture.md §6): a
        2k-token sample as lists would cost tens of thousands of msgpack items each way."""
        return {
            "qid": self.qid,
            "task": self.task,
            "prompt_ids": self.prompt_ids,
            "birth_time": float(self.birth_time),
            "metadata": dict(self.metadata),
            "samples": [_sample_msg(s) for s in self.samples],
        }

    @classmethod
    def from_msg(cls, msg: Any) -> "Trajectory":
        """Validate a received message (arrays from `to_msg`, or plain lists from other senders).
        Arrays of the right dtype are kept as they are (read-only views of the message)."""

        def need(obj: Any, key: str, types, where: str):
            if not isinstance(obj, dict) or key not in obj:
                raise TrajectoryFormatError(f"trajectory {where}: missing field {key!r}")
            value = obj[key]
            if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
                raise TrajectoryFormatError(
                    f"trajectory {where}.{key}: expected {_names(types)}, got {type(value).__name__}"
                )
            return value

        if not isinstance(msg, dict):
            raise TrajectoryFormatError(f"trajectory must be a map, got {type(msg).__name__}")
        qid = need(msg, "qid", str, "")
        where = f"{qid!r}"
        prompt_ids = _int_array(need(msg, "prompt_ids", (list, np.ndarray), where), f"{where}.prompt_ids", strict=True)
        raw_samples = need(msg, "samples", list, where)
        if not raw_samples:
            raise TrajectoryFormatError(f"trajectory {where}: 'samples' is empty")
        samples = []
        for i, s in enumerate(raw_samples):
            sw = f"{where}.samples[{i}]"
            output_ids = _int_array(need(s, "output_ids", (list, np.ndarray), sw), f"{sw}.output_ids", strict=True)
            logprobs = _float_array(need(s, "logprobs", (list, np.ndarray), sw), f"{sw}.logprobs", strict=True)
            versions = _int_array(need(s, "versions", (list, np.ndarray), sw), f"{sw}.versions", strict=True)
            loss_mask = (
                _int_array(need(s, "loss_mask", (list, np.ndarray), sw), f"{sw}.loss_mask", strict=True)
                if "loss_mask" in s
                else None
            )
            n = len(output_ids)
            for name, seq in (("logprobs", logprobs), ("versions", versions), ("loss_mask", loss_mask)):
                if seq is not None and len(seq) != n:
                    raise TrajectoryFormatError(f"trajectory {sw}.{name}: {len(seq)} entries for {n} output tokens")
            reward = need(s, "reward", (int, float), sw)
            bad = reward_problem(reward)
            if bad is not None:
                raise TrajectoryFormatError(
                    f"trajectory {sw}.reward: must be a finite number within ±{MAX_ABS_REWARD:g}; it {bad}"
                )
            if not n:
                raise TrajectoryFormatError(f"trajectory {sw}.output_ids: empty (a sample without generated tokens)")
            no_eos = bool(s.get("no_eos", False))
            metrics = s.get("metrics") or {}
            bad = metrics_problem(metrics)
            if bad is not None:
                raise TrajectoryFormatError(f"trajectory {sw}.metrics: {bad}")
            metrics = {k: float(v) for k, v in metrics.items()}
            samples.append(Sample._checked(output_ids, logprobs, versions, float(reward), no_eos, loss_mask, metrics))
        birth_time = msg.get("birth_time", 0.0)
        if not isinstance(birth_time, (int, float)) or isinstance(birth_time, bool) or not math.isfinite(birth_time):
            raise TrajectoryFormatError(
                f"trajectory {where}.birth_time: must be a finite number, got {birth_time!r:.80}"
            )
        metadata = msg.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TrajectoryFormatError(f"trajectory {where}.metadata: must be a map, got {type(metadata).__name__}")
        task = msg.get("task", "math")
        if not isinstance(task, str):
            raise TrajectoryFormatError(f"trajectory {where}.task: must be a string, got {type(task).__name__}")
        return cls(
            qid=qid,
            prompt_ids=prompt_ids,
            samples=samples,
            task=task,
            birth_time=float(birth_time),
            metadata=dict(metadata),
        )  # prompt_ids is int32 already: no conversion


def _sample_msg(s: Sample) -> Dict[str, Any]:
    msg = {
        "output_ids": s.output_ids,
        "logprobs": s.logprobs,
        "versions": s.versions,
        "no_eos": bool(s.no_eos),
        "reward": float(s.reward),
    }
    if not s.loss_mask.all():
        msg["loss_mask"] = s.loss_mask
    if s.metrics:
        msg["metrics"] = dict(s.metrics)  # checked by `problem` before sending, and on receipt
    return msg


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _names(types) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))
