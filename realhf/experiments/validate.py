"""`validate_experiment(cfg)`: every check of a whole experiment config, run before any process
starts (the entry point calls it through `realhf.experiments.async_ppo`): the values
(`validation`), the files they name (`file_validation`), then the rules that tie the batch, the
DP size and the rollout workers together."""

import os

from realhf.api.cli_args import AsyncPPOConfig
from realhf.base.allocation_mode import AllocationMode
from realhf.base.importing import use_import_roots
from realhf.experiments.file_validation import check_files, check_trainer_split
from realhf.experiments.validation import check_shapes, check_user_paths, check_values


def validate_experiment(cfg: AsyncPPOConfig) -> AllocationMode:
    """Raise ConfigError naming the first field that cannot work; return the parsed allocation.
    The user's code then imports in this process as it will in the workers (the launch directory
    and user_paths on the import path)."""
    check_user_paths(cfg.user_paths)
    use_import_roots(os.getcwd(), cfg.user_paths)  # before the checks below import the user's code
    alloc = check_values(cfg)
    check_files(cfg)
    check_trainer_split(cfg, alloc.train.tp, alloc.train.pp)
    check_shapes(cfg, alloc)
    return alloc
