"""The experiment config as the command line builds it: dataclass defaults, the YAML, overrides.

`training/main_async_ppo.py` composes through `hydra.main`; `--help`, tests and tools call
`compose_config` (Hydra's Compose API: the same result, without Hydra taking over the process).
"""

from __future__ import annotations

import os
from typing import Sequence

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from realhf.api.cli_args import AsyncPPOConfig
from realhf.base.package_files import CONFIG_DIR, files_root

REPO_ROOT = files_root()
CONFIG_NAME = "async-ppo"
SCHEMA_NAME = "async_ppo_schema"  # the YAML's `defaults:` names it


def register_schema() -> None:
    """Make the root dataclass the schema the YAML is merged onto (misspelt keys, wrong types fail)."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=AsyncPPOConfig)


def compose_config(
    overrides: Sequence[str] = (), config_dir: str = CONFIG_DIR, config_name: str = CONFIG_NAME
) -> AsyncPPOConfig:
    """The typed config a run with these command-line overrides would use."""
    register_schema()
    with initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None):
        cfg = compose(config_name=config_name, overrides=list(overrides))
    return OmegaConf.to_object(cfg)
