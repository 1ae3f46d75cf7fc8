"""One data-parallel rank of `training/main_sft.py dp=N` or `training/main_rm.py dp=N`, started
by that command (realhf.experiments.sft.launch_ranks), not by hand:

    python -m realhf.apps.sft_rank sft|rm CONFIG_YAML RANK WORLD_SIZE STORE_HOST:PORT WORK_DIR

It trains its share of every batch (realhf.experiments.sft.run_rank, realhf.experiments.rm.run_rank). Rank 0 prints the progress
and writes the report to WORK_DIR/report.json; a rank that fails writes its error to
WORK_DIR/error-rank<r>.json with its traceback (the launcher shows the error that came first:
a rank's failure makes its peers fail after it) and exits 1.
"""

import json
import sys
import time
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from realhf.api.cli_args import RMConfig, SFTConfig
from realhf.base.process_exit import run_then_exit


def _job(kind: str):
    """(config class, run_rank) of `kind`."""
    if kind == "rm":
        from realhf.experiments.rm import run_rank

        return RMConfig, run_rank
    if kind == "sft":
        from realhf.experiments.sft import run_rank

        return SFTConfig, run_rank
    raise ValueError(f"unknown rank kind {kind!r}: sft or rm")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 6:
        print(__doc__, file=sys.stderr)
        return 2
    kind, config_path, rank, world, store_addr = args[0], args[1], int(args[2]), int(args[3]), args[4]
    workdir = Path(args[5])
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        config_cls, run_rank = _job(kind)
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(config_cls), OmegaConf.load(config_path)))
        log = (lambda msg: print(msg, flush=True)) if rank == 0 else (lambda msg: None)
        report = run_rank(cfg, rank, world, store_addr, log)
        if rank == 0:
            tmp = workdir / "report.json.tmp"
            tmp.write_text(json.dumps(report))
            tmp.rename(workdir / "report.json")
        return 0
    except BaseException as e:  # noqa: BLE001 - whatever ends the rank is the run's error
        error = {
            "rank": rank,
            "time": time.time(),
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc(),
        }
        try:
            (workdir / f"error-rank{rank}.json").write_text(json.dumps(error))
        except OSError:  # the launcher is gone (its work dir with it): say it here
            traceback.print_exc()
        return 1


if __name__ == "__main__":
    run_then_exit(main)  # not sys.exit: realhf.base.process_exit says why
