"""Synthetic "write the function from its examples" problems: the embedded code task.

A problem shows three calls of a hidden one-line function and asks for its body; the reward is
whether the written function passes four hidden calls on other inputs (realhf.plugins.environments.code_env):

    prompt:     "f('bcg')='gcb'\\nf('hk')='kh'\\nf('wyzq')='qzyw'\\ndef f(x): return"
    completion: " x[::-1]"
    tests:      [["'vbh'", "'hbv'"], ...]      (argument and expected result, as Python literals)

The functions come from `FAMILIES`: integer arithmetic on 0..9 (the model must work out the
constant from the examples), string slicing and case, and list reductions. The examples of a
problem are drawn so that no other function of the families agrees with all of them: every
problem has one right answer among the functions the model has seen.

Strings are spelled with letters that occur in no word of the tokenizer (`STRING_LETTERS`), so
a string is always one token per character and reversing it is a matter of order, not of
splitting merged tokens. Generation is a pure function of (seed, split sizes).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Sequence, Tuple

CODE_PREFIX = "def f(x): return"  # the prompt's last line; the completion is the expression
ENTRY_POINT = "f"
N_EXAMPLES = 3  # calls shown in the prompt
N_TESTS = 4  # hidden calls the answer must pass, on other inputs
# No letter of any tokenizer word (def return upper sorted sum max min len), so no BPE merge applies.
STRING_LETTERS = "bcghjkqvwyz"
_MAX_DRAWS = 200


@dataclass(frozen=True)
class Family:
    kind: str  # "int" | "str" | "list": the argument's type
    bodies: Tuple[str, ...]  # the expressions, in x


def _int_bodies() -> Tuple[str, ...]:
    return tuple(f"x+{b}" for b in range(1, 10)) + tuple(f"x*{a}" for a in range(2, 10)) + ("x*x", "9-x")


FAMILIES: Tuple[Family, ...] = (
    Family("int", _int_bodies()),
    Family(
        "str",
        ("x[::-1]", "x.upper()", "x*2", "x[0]", "x[-1]", "x[1:]", "x[:-1]", "x[:2]", "x[::2]", "len(x)")
        + tuple(f"x+'{c}'" for c in "bgkw")
        + tuple(f"'{c}'+x" for c in "bgkw"),
    ),
    Family(
        "list",
        ("sorted(x)", "sorted(x)[::-1]", "sum(x)", "max(x)", "min(x)", "len(x)", "x[::-1]", "x[0]", "x[-1]", "x[1:]")
        + tuple(f"x+[{b}]" for b in range(1, 4)),
    ),
)


@dataclass(frozen=True)
class CodeProblem:
    prompt: str
    body: str  # the reference expression
    examples: Tuple[Tuple[str, str], ...]  # shown (argument, result) literals
    tests: Tuple[Tuple[str, str], ...]  # hidden ones


def vocabulary() -> List[str]:
    """Every word (run of 2+ letters) of the prompts' frame and the reference bodies, sorted."""
    words = set(re.findall(r"[A-Za-z]{2,}", CODE_PREFIX))
    for fam in FAMILIES:
        for body in fam.bodies:
            words.update(re.findall(r"[A-Za-z]{2,}", body))
    return sorted(words)


def _compile(body: str) -> Callable[[Any], Any]:
    return eval(f"lambda x: {body}")  # noqa: S307 - our own constant bodies, never model output


_COMPILED: Dict[str, Callable[[Any], Any]] = {}


def apply(body: str, arg: Any) -> Any:
    fn = _COMPILED.get(body)
    if fn is None:
        fn = _COMPILED[body] = _compile(body)
    return fn(arg)


def _draw_arg(rng: random.Random, kind: str) -> Any:
    if kind == "int":
        return rng.randint(0, 9)
    if kind == "str":
        return "".join(rng.choice(STRING_LETTERS) for _ in range(rng.randint(2, 5)))
    return [rng.randint(0, 9) for _ in range(rng.randint(2, 5))]


def _unambiguous(body: str, family: Family, args: Sequence[Any]) -> bool:
    """No other body of the family gives the same results on all of `args`."""
    want = [apply(body, a) for a in args]
    return not any(o != body and [apply(o, a) for a in args] == want for o in family.bodies)


def generate_problem(rng: random.Random) -> CodeProblem:
    family = rng.choice(FAMILIES)
    body = rng.choice(family.bodies)
    for _ in range(_MAX_DRAWS):
        args: List[Any] = []
        while len(args) < N_EXAMPLES + N_TESTS:  # distinct arguments: a test never repeats an example
            a = _draw_arg(rng, family.kind)
            if a not in args:
                args.append(a)
        shown, hidden = args[:N_EXAMPLES], args[N_EXAMPLES:]
        if _unambiguous(body, family, shown):
            break
    else:
        raise RuntimeError(f"no unambiguous examples for {body!r} in {_MAX_DRAWS} draws")
    examples = tuple((repr(a), repr(apply(body, a))) for a in shown)
    tests = tuple((repr(a), repr(apply(body, a))) for a in hidden)
    lines = [f"{ENTRY_POINT}({a})={r}" for a, r in examples]
    return CodeProblem(prompt="\n".join(lines + [CODE_PREFIX]), body=body, examples=examples, tests=tests)


def generate_splits(n_train: int, n_test: int, seed: int) -> Tuple[List[CodeProblem], List[CodeProblem]]:
    """Distinct train and test problems (no prompt twice, none in both); the test split is drawn
    first, so it does not depend on `n_train`."""
    rng = random.Random(seed)
    seen: set = set()

    def draw(n: int) -> List[CodeProblem]:
        out: List[CodeProblem] = []
        while len(out) < n:
            p = generate_problem(rng)
            if p.prompt not in seen:
                seen.add(p.prompt)
                out.append(p)
        return out

    test = draw(n_test)
    return draw(n_train), test


def to_rows(problems: Sequence[CodeProblem], split: str) -> List[Dict[str, object]]:
    """Rows in the prompt-dataset JSONL schema, with what the code environment needs."""
    return [
        {
            "query_id": f"{split}-{i:06d}",
            "prompt": p.prompt,
            "solutions": [" " + p.body],
            "task": "code",
            "code_prefix": CODE_PREFIX,
            "entry_point": ENTRY_POINT,
            "tests": [list(t) for t in p.tests],
        }
        for i, p in enumerate(problems)
    ]
