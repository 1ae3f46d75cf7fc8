"""python -m scripts.gpu_check unit|bench|e2e [options] — scripts/gpu_check.sh runs this after
installing the carried wheels."""

import sys


def main(argv) -> int:
    stages = ("unit", "bench", "e2e")
    if not argv or argv[0] not in stages:
        print(f"usage: python -m scripts.gpu_check {'|'.join(stages)} [options]", file=sys.stderr)
        return 2
    stage, rest = argv[0], argv[1:]
    if stage == "unit":
        from scripts.gpu_check.unit import main as run
    elif stage == "bench":
        from scripts.gpu_check.bench import main as run
    else:
        from scripts.gpu_check.e2e import main as run
    return run(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
