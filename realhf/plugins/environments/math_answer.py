"""Reading a math answer: the final answer of a solution text (`\\boxed{...}`, `#### N`, or the
last number), exact values of plain numbers, and the check that worked integer equations hold.

Pure string functions, no I/O: the grader (`math_grader`) and the `math` environment build on them.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Optional

# A minus sign counts only where it cannot be a subtraction ("5-2" has no "-2").
_NUMBER = re.compile(r"(?:(?<![\w.)\]}])-)?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?(?!\d)")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:,\d{3})*(?:\.\d*)?|\.\d+)(?:/\d+)?")


def _last_boxed(text: str) -> Optional[str]:
    """Content of the last `\\boxed{...}` whose braces balance (nesting allowed)."""
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        start = text.rfind("\\boxed", 0, start)
    return None


_WORK_LINE = re.compile(r"(?<![\d.])(\d+)\s*([+\-*])\s*(\d+)\s*=\s*(-?\d+)(?![\d.])")


def work_lines_correct(text: str) -> bool:
    """True when every integer equation `a+b=c`, `a-b=c` or `a*b=c` written in `text` holds (and
    when there is none). Only whole integers count: `1.5+2=3.5` is not checked."""
    ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return all(ops[op](int(a), int(b)) == int(c) for a, op, b, c in _WORK_LINE.findall(text))


def extract_answer(text: str) -> Optional[str]:
    """The final answer of a solution: the last `\\boxed{...}`, else the rest of the line after the
    first `####`, else the last number in the text; None if there is none."""
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    m = re.search(r"####[ \t]*([^\n]*)", text)
    if m:
        ans = m.group(1).strip().rstrip(".").strip()
        if ans:
            return ans
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def parse_number(s: str) -> Optional[Fraction]:
    """An exact value for a plain number ("3", "03", "-2.50", "1,000", "1/2", "$3$"), else None."""
    s = s.strip()
    if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    if not _PLAIN_NUMBER.fullmatch(s):
        return None
    s = s.replace(",", "")
    if s.endswith("."):
        s = s[:-1]
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):  # "1/0"
        return None


def numbers_equal(a: str, b: str) -> Optional[bool]:
    """Exact numeric equality when both are plain numbers; None when either is not."""
    x, y = parse_number(a), parse_number(b)
    if x is None or y is None:
        return None
    return x == y
