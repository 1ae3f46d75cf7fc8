"""The slowest tests of one `bash scripts/test.sh` run, over all its lanes (pytest's own
`--durations` sees one lane's process only), and the waits that came nearest their timeouts:
read from the lanes' JUnit XML reports.

    python -m scripts.slowest_tests REPORT.xml [REPORT.xml ...] [--top 25] [--waits 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator, List, Tuple


def _cases(paths: List[str]) -> Iterator[Tuple[str, str, ET.Element]]:
    """(lane, test id, testcase element) of every test case in the reports; a missing or cut-off
    report (a lane killed mid-run) is skipped, saying so."""
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"[test] no timings from {path}: {e}", file=sys.stderr)
            continue
        for case in root.iter("testcase"):
            yield Path(path).stem, f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":"), case


def test_times(paths: List[str]) -> List[Tuple[float, str, str]]:
    """(seconds, lane, test id) of every test case in the reports, slowest first."""
    return sorted(((float(case.get("time") or 0.0), lane, name) for lane, name, case in _cases(paths)), reverse=True)


def tight_waits(paths: List[str]) -> List[Tuple[float, float, float, str, str, str]]:
    """(share of its timeout, seconds taken, timeout, what, lane, test id) of each test's
    tightest wait (tests/conftest.py's `tightest_wait` property), tightest first."""
    out = []
    for lane, name, case in _cases(paths):
        for prop in case.iter("property"):
            if prop.get("name") == "tightest_wait":
                took, timeout, what = json.loads(prop.get("value") or "null")
                out.append((took / timeout, took, timeout, what, lane, name))
    return sorted(out, reverse=True)


def _module(name: str) -> str:
    """tests.a.test_b (the file) of `tests.a.test_b[.TestClass]::test_c`."""
    parts = name.split("::")[0].split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    return ".".join(parts[: modules[0] + 1]) if modules else ".".join(parts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.slowest_tests", description=__doc__.split("\n")[0])
    p.add_argument("reports", nargs="+")
    p.add_argument("--top", type=int, default=25, help="how many to print (0: all)")
    p.add_argument("--by-file", action="store_true", help="sum the tests of each file instead")
    p.add_argument("--waits", type=int, default=10, help="how many of the tightest waits to print (0: none)")
    args = p.parse_args(argv)
    times = test_times(args.reports)
    if not times:
        return 0
    if args.by_file:
        files: dict = {}
        for seconds, lane, name in times:
            files[(lane, _module(name))] = files.get((lane, _module(name)), 0.0) + seconds
        times = sorted(((t, lane, f) for (lane, f), t in files.items()), reverse=True)
    args.top = args.top or len(times)
    print(
        f"[test] the {min(args.top, len(times))} slowest of {len(times)} {'files' if args.by_file else 'tests'} ({sum(t for t, _, _ in times):.0f} s in all):"
    )
    for seconds, lane, name in times[: args.top]:
        print(f"  {seconds:7.1f} s  {lane:<6}  {name[:110]}")
    if args.waits > 0:
        _print_waits(tight_waits(args.reports)[: args.waits])
    return 0


def _print_waits(waits) -> None:
    if waits:
        print(f"[test] the {len(waits)} waits nearest their timeouts (helpers.wait):")
    for share, took, timeout, what, lane, name in waits:
        print(f"  {share:4.0%} {took:6.1f} s of {timeout:g} s  {lane:<6}  {name[:80]}: {what[:60]}")


if __name__ == "__main__":
    sys.exit(main())
