"""The slowest tests of one `bash scripts/test.sh` run, over all its lanes (pytest's own
`--durations` sees one lane's process only): read from the lanes' JUnit XML reports.

    python -m scripts.slowest_tests REPORT.xml [REPORT.xml ...] [--top 25]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import List, Tuple


def test_times(paths: List[str]) -> List[Tuple[float, str, str]]:
    """(seconds, lane, test id) of every test case in the reports; a missing or cut-off report
    (a lane killed mid-run) is skipped, saying so."""
    out = []
    for path in paths:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            print(f"[test] no timings from {path}: {e}", file=sys.stderr)
            continue
        lane = Path(path).stem
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
            out.append((float(case.get("time") or 0.0), lane, name))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
