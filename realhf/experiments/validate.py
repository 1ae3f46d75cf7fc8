"""`validate_experiment(cfg)`: every check of a whole experiment config, run before any process
starts (the entry point calls it through `realhf.experiments.async_ppo_math`): the values
(`validation`), the files they name (`file_validation`), then the rules that tie the batch, the
DP size and the rollout workers together."""

from realhf.api.cli_args import AsyncPPOMATHConfig
from realhf.base.allocation_mode import AllocationMode
from realhf.experiments.file_validation import check_files
from realhf.experiments.validation import check_shapes, check_values


def validate_experiment(cfg: AsyncPPOMATHConfig) -> AllocationMode:
    """Raise ConfigError naming the first field that cannot work; return the parsed allocation."""
    alloc = check_values(cfg)
    check_files(cfg)
    check_shapes(cfg, alloc)
    return alloc
