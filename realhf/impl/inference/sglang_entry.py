"""`python -m realhf.impl.inference.sglang_entry --api-key-file PATH <sglang flags>`: run
`sglang.launch_server` with `--api-key <the file's content>` added to its arguments inside this
process. SGLang takes its key only as a flag; added here, after exec, it never shows on a command
line (`/proc/<pid>/cmdline` keeps the argv the process was started with) while SGLang requires
`Authorization: Bearer <key>` like every other endpoint of the run (docs/architecture.md §12.6).
"""

import runpy
import sys
from typing import List


def main(argv: List[str]) -> None:
    if len(argv) < 2 or argv[0] != "--api-key-file":
        raise SystemExit("usage: python -m realhf.impl.inference.sglang_entry --api-key-file PATH [sglang flags]")
    with open(argv[1]) as f:
        key = f.read().strip()
    if not key:
        raise SystemExit(f"{argv[1]} is empty: expected the run's secret")
    sys.argv = ["sglang.launch_server", *argv[2:], "--api-key", key]
    runpy.run_module("sglang.launch_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
