"""The command line of a model trained on the RL trainer's engine outside an RL run
(`training/main_sft.py`, `training/main_rm.py`): Hydra over the command's config dataclass, a
misspelt key named before Hydra sees it, a failing rank's traceback and error, Ctrl-C ending
every rank, and the report printed as one JSON line."""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Dict

import hydra
import transformers
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from realhf.experiments.config_keys import check_overrides
from realhf.experiments.sft import SFTRankError


def run(name: str, schema: type, train: Callable[..., Dict[str, Any]], summary: Callable[[Dict], Dict]) -> int:
    """Parse `sys.argv` into `schema` (key=value overrides), run `train(cfg, log=...)`, print
    `<NAME> result: {summary(report)}`."""
    unknown = check_overrides(sys.argv[1:], schema)
    if unknown is not None:
        print(f"config error: {unknown}", file=sys.stderr)
        return 2
    ConfigStore.instance().store(name=f"{name}_schema", node=schema)
    # The primary config: the schema plus Hydra settings that keep the app from creating outputs/
    # directories and from replacing the logging configuration.
    ConfigStore.instance().store(
        name=name,
        node={
            "defaults": [
                f"{name}_schema",
                "_self_",
                {"override hydra/job_logging": "disabled"},
                {"override hydra/hydra_logging": "disabled"},
            ],
            "hydra": {"run": {"dir": "."}, "output_subdir": None},
        },
    )

    def main(cfg) -> None:
        transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint load is noise
        try:
            report = train(OmegaConf.to_object(cfg), log=lambda msg: print(msg, flush=True))
        except SFTRankError as e:
            print(e.traceback, file=sys.stderr, end="", flush=True)  # where the first failing rank failed
            raise SystemExit(f"error: {e}") from None
        except KeyboardInterrupt:
            print("interrupted: every rank stopped", file=sys.stderr, flush=True)
            raise SystemExit(130) from None
        print(f"{name.upper()} result: " + json.dumps(summary(report)), flush=True)

    return hydra.main(version_base=None, config_name=name)(main)()
