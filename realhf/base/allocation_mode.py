"""`allocation_mode`: where generation servers and the trainer run (docs/architecture.md §8).

Grammar:

    <engine>.<gen>+<train>        e.g.  sglang.d4p1m1+d2p2m1,  native.d1m1p1+d1m1p1
    <gen>, <train> := one or more of d<int>, m<int>, p<int>, in any order, each at most once

    d = data parallel, m = tensor (model) parallel, p = pipeline parallel; a missing letter is 1.
    engine = native (built-in engine, CPU or GPU), sglang (SGLang servers, GPU) or vllm (realhf's
    server around vLLM: its CPU build, or vLLM on a GPU).

The first part describes the generation servers (`gen.dp` servers, each `tp·pp` devices), the
second the trainer. Both parts are required. Which GPUs each process gets is
`realhf.base.placement`'s (cluster.gpu_placement).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ENGINES = ("native", "sglang", "vllm")
GRAMMAR = (
    "expected '<engine>.d<dp>m<tp>p<pp>+d<dp>m<tp>p<pp>' (generation servers + trainer; "
    f"engine one of {', '.join(ENGINES)}; letters d/m/p in any order, each at most once, "
    "missing ones default to 1), e.g. 'sglang.d4p1m1+d2p2m1' or 'native.d1m1p1+d1m1p1'"
)
_TERM = re.compile(r"([a-z])(\d+)")


class AllocationModeError(ValueError):
    """A malformed or unsatisfiable `allocation_mode`; says which part and what to write."""

    def __init__(self, value: str, problem: str, part: str | None = None, show_grammar: bool = True):
        self.field = "allocation_mode"
        self.value = value
        self.part = part
        where = f"bad part {part!r}: " if part is not None else ""
        message = f"allocation_mode={value!r}: {where}{problem}"
        if show_grammar:
            message += f"; {GRAMMAR}"
        super().__init__(message)


@dataclass(frozen=True)
class ParallelStrategy:
    dp: int = 1  # data parallel
    tp: int = 1  # tensor parallel (written `m`)
    pp: int = 1  # pipeline parallel

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def __str__(self) -> str:
        return f"d{self.dp}m{self.tp}p{self.pp}"


@dataclass(frozen=True)
class AllocationMode:
    gen_engine: str
    gen: ParallelStrategy
    train: ParallelStrategy

    def __str__(self) -> str:
        return f"{self.gen_engine}.{self.gen}+{self.train}"

    @classmethod
    def parse(cls, s: str) -> "AllocationMode":
        if not isinstance(s, str):
            raise AllocationModeError(repr(s), f"must be a string, got {type(s).__name__}")
        value = s
        s = s.strip()
        engine, dot, parts = s.partition(".")
        if not dot:
            raise AllocationModeError(value, "missing the '<engine>.' prefix")
        if engine not in ENGINES:
            raise AllocationModeError(value, f"unknown engine {engine!r}", engine)
        halves = parts.split("+")
        if len(halves) != 2:
            raise AllocationModeError(
                value,
                f"needs exactly two parts joined by '+', generation servers and trainer; got {len(halves)}",
                parts,
            )
        for half, role in zip(halves, ("generation", "trainer")):
            if not half:
                raise AllocationModeError(value, f"the {role} part is empty", parts)
        gen, train = (_parse_strategy(value, half, role) for half, role in zip(halves, ("generation", "trainer")))
        return cls(engine, gen, train)

    def validate(self) -> None:
        """Check what the engines and the trainer support; raise AllocationModeError if not. (Whether
        the processes fit the cluster's GPUs: `realhf.base.placement`.)"""

        def fail(problem: str) -> None:
            raise AllocationModeError(str(self), problem, show_grammar=False)

        if self.gen_engine == "native" and (self.gen.tp != 1 or self.gen.pp != 1):
            fail(
                f"the native engine runs each generation server on one device, so it needs m1 p1 "
                f"(got m{self.gen.tp} p{self.gen.pp}); use more servers (d) instead, or the sglang engine on GPUs"
            )
        if self.gen_engine == "vllm" and (self.gen.tp != 1 or self.gen.pp != 1):
            fail(
                f"realhf's vLLM servers run on one device each for now, so they need m1 p1 "
                f"(got m{self.gen.tp} p{self.gen.pp}); use more servers (d) instead"
            )


def _parse_strategy(value: str, part: str, role: str) -> ParallelStrategy:
    sizes: dict[str, int] = {}
    position = 0
    for match in _TERM.finditer(part):
        if match.start() != position:
            break
        letter, number = match.group(1), int(match.group(2))
        if letter not in "dmp":
            hint = " (tensor parallelism is spelled 'm')" if letter == "t" else ""
            raise AllocationModeError(value, f"unknown parallelism letter {letter!r}{hint} in the {role} part", part)
        if letter in sizes:
            raise AllocationModeError(value, f"{letter!r} appears twice in the {role} part", part)
        if number < 1:
            raise AllocationModeError(value, f"{letter}{match.group(2)} must be a positive integer", part)
        sizes[letter] = number
        position = match.end()
    if position != len(part):
        raise AllocationModeError(
            value, f"cannot read {part[position:]!r} in the {role} part (each term is a letter and a number)", part
        )
    return ParallelStrategy(dp=sizes.get("d", 1), tp=sizes.get("m", 1), pp=sizes.get("p", 1))
