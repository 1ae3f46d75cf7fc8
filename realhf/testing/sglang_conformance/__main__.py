"""python -m realhf.testing.sglang_conformance --url http://HOST:PORT [--control] [--weights --model-path DIR]

One line per SGLang endpoint realhf uses (PASS, FAIL with the first mismatch, or SKIP with the
flag that would exercise it); exit status 1 when any failed, 2 when the server cannot be reached.
"""

from __future__ import annotations

import argparse
import sys

from realhf.testing.sglang_conformance.fixtures import SGLANG
from realhf.testing.sglang_conformance.suite import run_suite


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m realhf.testing.sglang_conformance",
        description=f"Check a running server against SGLang {SGLANG['release']}'s HTTP protocol, as realhf uses it.",
    )
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument(
        "--control",
        action="store_true",
        help="also /pause_generation and /continue_generation (aborts running requests)",
    )
    p.add_argument(
        "--weights",
        action="store_true",
        help="also the weight updates: loads --model-path from disk, then broadcasts it (the served version goes up)",
    )
    p.add_argument("--model-path", help="for --weights: the server's own model folder (the same weights are loaded)")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help="for --weights: the broadcast's backend")
    p.add_argument("--bind-host", default="127.0.0.1", help="for --weights: where this process hosts the group's store")
    p.add_argument("--server-tp-size", type=int, default=1, help="for --weights: the server's tensor-parallel ranks")
    p.add_argument("--api-key", default="", help="sent as Authorization: Bearer (SGLang's --api-key)")
    p.add_argument(
        "--strict",
        action="store_true",
        help="no answer key beyond SGLang's and realhf's declared own (the built-in server)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds each call may take")
    p.add_argument("-v", "--verbose", action="store_true", help="every mismatch, not only each endpoint's first")
    args = p.parse_args(argv)
    if args.weights and not args.model_path:
        p.error("--weights needs --model-path (the weights to load and broadcast)")
    print(f"SGLang {SGLANG['release']} protocol ({SGLANG['package']}) against {args.url}", flush=True)
    try:
        outcomes = run_suite(
            args.url,
            control=args.control,
            weights=args.weights,
            model_path=args.model_path,
            strict=args.strict,
            api_key=args.api_key,
            timeout=args.timeout,
            backend=args.backend,
            bind_host=args.bind_host,
            server_tp_size=args.server_tp_size,
        )
    except ConnectionError as e:
        print(f"ERROR {e}", flush=True)
        return 2
    for o in outcomes:
        print(o.line())
        if args.verbose:
            for problem in o.problems[1:]:
                print(f"      {problem}")
    failed = [o for o in outcomes if not o.ok]
    print(
        f"{len(outcomes) - len(failed)} passed, {len(failed)} failed"
        if failed
        else f"all {len(outcomes)} endpoints conform"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
