"""`python -m scripts.bench all|e2e|generation|generation_sizes|stream|weight_update|manager|scaling|trainer|engine|launchers|time_to_accuracy|data_parallel|vs_trl|levers|vs_trl_smollm2|long_task|vs_trl_long|timeline|vllm_engine|reward_isolation [--short] [--out-dir docs] [--args='...']`

Runs the chosen benchmarks one after another, each in its own process, and merges their JSON
lines into `<out-dir>/benchmarks.json` and the generated tables into `<out-dir>/benchmarks.md`
(`all` writes to `docs/` by default; a single benchmark writes only when `--out-dir` is given).
"""

import argparse
import shlex
import sys

from scripts.bench import BENCHMARKS
from scripts.bench.common import log, run_benchmark, write_docs

# Generous per-benchmark limits (full mode, busy 2-core machine); a hang still ends.
TIMEOUT_S = {
    "e2e": 3600,
    "scaling": 3600,
    "generation": 1800,
    "generation_sizes": 1800,
    "stream": 600,
    "weight_update": 900,
    "manager": 600,
    "trainer": 600,
    "engine": 600,
    "launchers": 1800,
    "time_to_accuracy": 5400,
    "data_parallel": 5400,
    "vs_trl": 7200,
    "levers": 7200,
    "vs_trl_smollm2": 14400,
    "long_task": 900,
    "vs_trl_long": 36000,
    "timeline": 1800,
    "vllm_engine": 1800,
    "reward_isolation": 3600,
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.bench", description=__doc__.split("\n")[0])
    p.add_argument("which", nargs="+", choices=("all",) + BENCHMARKS, help="benchmarks to run")
    p.add_argument("--short", action="store_true", help="quick smoke mode of every benchmark")
    p.add_argument("--out-dir", default=None, help="where benchmarks.md/.json go (default: docs for 'all')")
    p.add_argument(
        "--args", default="", help="passed to the one benchmark chosen, e.g. --args='--seeds 1' for vs_trl_smollm2"
    )
    args = p.parse_args(argv)
    names = list(BENCHMARKS) if "all" in args.which else list(dict.fromkeys(args.which))
    if args.args and len(names) != 1:
        p.error(f"--args goes to one benchmark, not {len(names)}")
    out_dir = args.out_dir if args.out_dir is not None else ("docs" if "all" in args.which else None)
    results, failed = {}, []
    for name in names:
        log(f"running {name} ({'short' if args.short else 'full'} mode)")
        try:
            results[name] = run_benchmark(
                name, args.short, TIMEOUT_S[name] * (0.5 if args.short else 1), shlex.split(args.args)
            )
        except Exception as e:  # noqa: BLE001 - one failing benchmark does not lose the others' numbers
            log(f"{name} FAILED: {e}")
            failed.append(name)
        if out_dir and name in results:  # write after each benchmark: a long suite keeps what it measured
            write_docs(out_dir, {name: results[name]}, BENCHMARKS)
    if out_dir:
        log(f"wrote {out_dir}/benchmarks.md and {out_dir}/benchmarks.json")
    if failed:
        log(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
