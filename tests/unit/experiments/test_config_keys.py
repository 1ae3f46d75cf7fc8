"""A misspelt key on the command line is refused naming the key that was meant
(realhf.experiments.config_keys), never with Hydra's advice to prepend '+'."""

import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from realhf.api.cli_args import AsyncPPOConfig
from realhf.experiments.config_keys import check_overrides, unknown_key
from realhf.experiments.config_loading import compose_config
from realhf.experiments.validation import ConfigError, check_known_keys


@pytest.mark.parametrize(
    "override, meant",
    [
        ("cluster.restart_policy.max_restart=2", "cluster.restart_policy.max_restarts"),  # a typo
        ("rollout.max_concurent_rollouts=3", "max_concurrent_rollouts"),  # a typo at the wrong level
        ("actor.optimiser.lr=1e-4", "actor.optimizer.lr"),  # a misspelt group: what follows is kept
        ("+cluster.ray.resources.model_wroker.node_a=1", "cluster.ray.resources.model_worker.node_a"),
        ("~rollout.agnt", "rollout.agent"),
    ],
)
def test_a_misspelt_key_is_refused_with_the_closest_valid_key(override, meant):
    why = check_overrides([override], AsyncPPOConfig)
    key = override.lstrip("+~").split("=")[0]
    assert why == f"{key}: no such field (did you mean {meant}?)"


def test_a_key_added_with_plus_is_refused_after_composition_with_the_closest_key():
    cfg = compose_config(["+cluster.restart_policy.max_restart=2"])  # Hydra adds it without a look
    with pytest.raises(
        ConfigError, match=r"max_restart: no such field \(did you mean cluster.restart_policy.max_restarts\?\)"
    ):
        check_known_keys(cfg)


def test_a_key_like_none_lists_the_fields_where_it_went_wrong():
    assert unknown_key("rollout.zzzz", AsyncPPOConfig) == (
        "rollout.zzzz: no such field (the fields of rollout are agent, env, episode_timeout, group_in_one_request, n_workers, request_timeout)"
    )


def test_valid_keys_mappings_and_hydras_own_arguments_pass():
    args = [
        "groups_per_step=4",
        "+rollout.agent.args.marker=x",  # a mapping takes any key
        "hydra.run.dir=.",
        "--config-name",
        "async-ppo-smollm2",
        "-h",
        "not an override",  # left to Hydra, which says what it cannot parse
    ]
    assert check_overrides(args, AsyncPPOConfig) is None


@pytest.mark.system
def test_help_with_a_misspelt_key_says_the_key_that_was_meant_in_one_line():
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", "--help", "cluster.restart_policy.max_restart=2"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=REPO),  # this checkout's realhf, not an installed one
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        "config error: cluster.restart_policy.max_restart: no such field (did you mean "
        "cluster.restart_policy.max_restarts?); `python training/main_async_ppo.py --help` lists every field"
    ]
    assert proc.stdout == ""
