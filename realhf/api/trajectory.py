"""The trajectory message: one finished prompt group, rollout worker → trainer (DESIGN §6).

On the wire it is a plain msgpack map (`to_msg` / `from_msg`), never a pickled object:

    {qid, task, prompt_ids, birth_time, metadata,
     samples: [{output_ids, logprobs, versions, loss_mask, no_eos, reward}, ...]}

with the token-level fields as numpy arrays (int32 ids, versions and mask, float32 log-probs);
`from_msg` also accepts plain lists from other senders.

`output_ids` holds everything after the prompt. Tokens the agent inserted itself (an
environment's feedback turn in a multi-turn episode) are in `output_ids` with `loss_mask` 0,
behaviour log-prob 0 and the version of the surrounding generation; generated tokens have
`loss_mask` 1. `from_msg` validates a received message and says which field is wrong, so a
malformed message is rejected at the receiver instead of failing inside the trainer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np


class TrajectoryFormatError(ValueError):
    pass


@dataclass
class Sample:
    output_ids: List[int]
    logprobs: List[float]  # behaviour log-prob of each output token
    versions: List[int]  # weight version that produced each output token
    reward: float
    no_eos: bool = False  # True when the answer was cut at max_new_tokens
    loss_mask: Optional[List[int]] = None  # None: every output token is trained on

    def mask(self) -> List[int]:
        return [1] * len(self.output_ids) if self.loss_mask is None else self.loss_mask


@dataclass
class Trajectory:
    qid: str
    prompt_ids: List[int]
    samples: List[Sample]
    task: str = "math"
    birth_time: float = field(default_factory=time.time)
    metadata: Dict[str, Any] = field(default_factory=dict)

    # ---- staleness (DESIGN §4) ----------------------------------------------------------------
    @property
    def version_start(self) -> int:
        """The oldest weight version behind any generated token of the group."""
        vs = [v for s in self.samples for v, m in zip(s.versions, s.mask()) if m]
        return min(vs) if vs else 0

    @property
    def version_end(self) -> int:
        vs = [v for s in self.samples for v, m in zip(s.versions, s.mask()) if m]
        return max(vs) if vs else 0

    @property
    def n_generated_tokens(self) -> int:
        return sum(sum(s.mask()) for s in self.samples)

    # ---- wire format --------------------------------------------------------------------------
    def to_msg(self) -> Dict[str, Any]:
        """Token-level fields travel as numpy arrays (one msgpack binary each, DESIGN §6): a
        2k-token sample as lists would cost tens of thousands of msgpack items each way."""
        return {
            "qid": self.qid,
            "task": self.task,
            "prompt_ids": np.asarray(self.prompt_ids, dtype=np.int32),
            "birth_time": float(self.birth_time),
            "metadata": dict(self.metadata),
            "samples": [
                {
                    "output_ids": np.asarray(s.output_ids, dtype=np.int32),
                    "logprobs": np.asarray(s.logprobs, dtype=np.float32),
                    "versions": np.asarray(s.versions, dtype=np.int32),
                    "loss_mask": np.asarray(s.mask(), dtype=np.int32),
                    "no_eos": bool(s.no_eos),
                    "reward": float(s.reward),
                }
                for s in self.samples
            ],
        }

    @classmethod
    def from_msg(cls, msg: Any) -> "Trajectory":
        """Validate a received message (arrays from `to_msg`, or plain lists from other senders)."""
        def need(obj: Any, key: str, types, where: str):
            if not isinstance(obj, dict) or key not in obj:
                raise TrajectoryFormatError(f"trajectory {where}: missing field {key!r}")
            value = obj[key]
            if not isinstance(value, types) or isinstance(value, bool) and bool not in _as_tuple(types):
                raise TrajectoryFormatError(
                    f"trajectory {where}.{key}: expected {_names(types)}, got {type(value).__name__}"
                )
            return value

        def int_list(obj, key, where) -> List[int]:
            values = need(obj, key, (list, np.ndarray), where)
            if isinstance(values, np.ndarray):
                if values.ndim != 1 or values.dtype.kind not in "iu":
                    raise TrajectoryFormatError(f"trajectory {where}.{key}: expected a 1-d integer array, got "
                                                f"{values.dtype} of shape {values.shape}")
                return values.tolist()
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                raise TrajectoryFormatError(f"trajectory {where}.{key}: every entry must be an int")
            return values

        def float_list(obj, key, where) -> List[float]:
            values = need(obj, key, (list, np.ndarray), where)
            if isinstance(values, np.ndarray):
                if values.ndim != 1 or values.dtype.kind not in "fiu" or not np.isfinite(values).all():
                    raise TrajectoryFormatError(f"trajectory {where}.{key}: expected a 1-d array of finite numbers")
                return values.astype(np.float64).tolist()
            if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in values):
                raise TrajectoryFormatError(f"trajectory {where}.{key}: every entry must be a finite number")
            return [float(x) for x in values]

        if not isinstance(msg, dict):
            raise TrajectoryFormatError(f"trajectory must be a map, got {type(msg).__name__}")
        qid = need(msg, "qid", str, "")
        where = f"{qid!r}"
        prompt_ids = int_list(msg, "prompt_ids", where)
        raw_samples = need(msg, "samples", list, where)
        if not raw_samples:
            raise TrajectoryFormatError(f"trajectory {where}: 'samples' is empty")
        samples = []
        for i, s in enumerate(raw_samples):
            sw = f"{where}.samples[{i}]"
            output_ids = int_list(s, "output_ids", sw)
            logprobs = float_list(s, "logprobs", sw)
            versions = int_list(s, "versions", sw)
            loss_mask = int_list(s, "loss_mask", sw) if "loss_mask" in s else None
            n = len(output_ids)
            for name, seq in (("logprobs", logprobs), ("versions", versions), ("loss_mask", loss_mask)):
                if seq is not None and len(seq) != n:
                    raise TrajectoryFormatError(
                        f"trajectory {sw}.{name}: {len(seq)} entries for {n} output tokens"
                    )
            reward = need(s, "reward", (int, float), sw)
            no_eos = bool(s.get("no_eos", False))
            samples.append(Sample(output_ids, logprobs, versions, float(reward), no_eos, loss_mask))
        birth_time = msg.get("birth_time", 0.0)
        if not isinstance(birth_time, (int, float)) or isinstance(birth_time, bool) or not math.isfinite(birth_time):
            raise TrajectoryFormatError(f"trajectory {where}.birth_time: must be a finite number, got {birth_time!r:.80}")
        metadata = msg.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise TrajectoryFormatError(f"trajectory {where}.metadata: must be a map, got {type(metadata).__name__}")
        task = msg.get("task", "math")
        if not isinstance(task, str):
            raise TrajectoryFormatError(f"trajectory {where}.task: must be a string, got {type(task).__name__}")
        return cls(qid=qid, prompt_ids=prompt_ids, samples=samples, task=task, birth_time=float(birth_time),
                   metadata=dict(metadata))


def _as_tuple(types) -> tuple:
    return types if isinstance(types, tuple) else (types,)


def _names(types) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(types))
