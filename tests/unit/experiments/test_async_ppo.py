"""The experiment config: YAML ↔ dataclasses, overrides, and refusals before any process starts."""

import os
import subprocess
import sys

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from helpers.paths import REPO
from realhf.api.cli_args import AsyncPPOConfig, ExperimentSaveEvalControl
from realhf.experiments.async_ppo import initial_setup, total_train_steps
from realhf.experiments.config_loading import CONFIG_DIR, compose_config
from realhf.experiments.validate import validate_experiment
from realhf.experiments.validation import ConfigError
from realhf.system.streams.push_pull_stream import grouping

check_config = validate_experiment


def load(*overrides) -> AsyncPPOConfig:
    return compose_config(overrides)


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


def _leaf_keys(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _leaf_keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_every_yaml_key_is_a_dataclass_field():
    with open(os.path.join(CONFIG_DIR, "async-ppo.yaml")) as f:
        doc = yaml.safe_load(f)
    doc.pop("defaults"), doc.pop("hydra")
    schema = OmegaConf.structured(AsyncPPOConfig)
    for key in _leaf_keys(doc):
        assert OmegaConf.select(schema, key, default="__missing__") != "__missing__", f"{key} is not a field"


def test_defaults_compose_into_the_typed_config_and_pass_the_checks():
    cfg = load()
    assert isinstance(cfg, AsyncPPOConfig)
    assert cfg.max_head_offpolicyness == 2 and cfg.group_size == 8
    check_config(cfg)


def test_misspelt_override_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as e:
        load("max_head_offpolicy=3")
    assert "max_head_offpolicy" in str(e.value) + str(e.value.__cause__)


def test_wrong_type_override_fails_naming_the_key():
    with pytest.raises(ConfigCompositionException) as e:
        load("group_size=many")
    assert "group_size" in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize(
    "override, field",
    [
        ("allocation_mode=native.d1m2p1+d1m1p1", "allocation_mode"),
        ("allocation_mode=sglang.d1m1p1+d1m1p1", "allocation_mode"),
        ("allocation_mode=native.d1+d1+d1", "allocation_mode"),
        ("group_size=0", "group_size"),
        ("groups_per_step=-1", "groups_per_step"),
        ("max_head_offpolicyness=-1", "max_head_offpolicyness"),
        ("rollout.agent.success_rate_lb=0.9 rollout.agent.success_rate_ub=0.5", "rollout.agent.success_rate_lb"),
        ("actor.path=/nonexistent/model", "actor.path"),
        ("dataset.path=/nonexistent.jsonl", "dataset.path"),
        ("schedule_policy=fastest", "schedule_policy"),
        ("recover_mode=sometimes", "recover_mode"),
        ("ppo.gen.temperature=0", "ppo.gen.temperature"),
        ("max_concurrent_rollouts=8", "max_concurrent_rollouts"),
        ("stats.wandb_mode=sometimes", "stats.wandb_mode"),
        ("stats.prometheus_port=70000", "stats.prometheus_port"),
        ("allocation_mode=native.d1+d2 groups_per_step=15", "groups_per_step"),
        ("allocation_mode=native.d1+d4 rollout.n_workers=2 groups_per_step=16", "rollout.n_workers"),
        ("rollout.agent.type=no_such_module:Agent", "rollout.agent.type"),
        ("rollout.agent.type=agents/no_such_file.py:Agent", "rollout.agent.type"),
        ("user_paths=[no_such_dir]", r"user_paths\[0\]"),
        ("rollout.env.type=realhf.api.env:make_env", "rollout.env.type"),
        ("cluster.restart_policy.max_restarts=-1", "cluster.restart_policy.max_restarts"),
        ("cluster.worker_template=/tmp/t.sock cluster.fork_workers=false", "cluster.worker_template"),
        ("cluster.worker_template=/tmp/t.sock cluster.launcher=ray", "cluster.worker_template"),
    ],
)
def test_values_that_cannot_run_are_refused_naming_the_field(override, field):
    cfg = load(*override.split())
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        check_config(cfg)


def test_initial_setup_gives_every_worker_type_its_share():
    cfg = load("allocation_mode=native.d2+d2", "rollout.n_workers=3", "max_concurrent_rollouts=30")
    specs = {s.worker_type: s for s in initial_setup(cfg)}
    assert specs["generation_server"].count == 2 and specs["gserver_manager"].count == 1
    assert specs["model_worker"].count == 2 and specs["rollout_worker"].count == 3
    assert specs["master_worker"].count == 1 and specs["master_worker"].echo_log
    rollout = specs["rollout_worker"].configs[0]
    assert rollout.n_pullers == 2 and rollout.max_concurrent_rollouts == 10 and rollout.group_size == 8
    manager = specs["gserver_manager"].configs[0]
    assert (manager.groups_per_step, manager.max_head_offpolicyness, manager.n_servers) == (16, 2, 2)
    assert specs["model_worker"].configs[0].run_dir == manager.run_dir  # weights written where the manager reads


@pytest.mark.parametrize("dp", [1, 2, 4])
def test_by_default_every_dp_rank_gets_two_rollout_workers_so_one_restarting_leaves_it_fed(dp):
    cfg = load(f"allocation_mode=native.d1+d{dp}")
    specs = {s.worker_type: s for s in initial_setup(cfg)}
    rollout = specs["rollout_worker"]
    assert rollout.count == len(rollout.configs) == 2 * dp
    assert specs["master_worker"].configs[0].expected_workers["rollout_worker"] == 2 * dp
    # max_concurrent_rollouts (32) is over all of them; each rank keeps its share in flight.
    assert rollout.configs[0].max_concurrent_rollouts == 32 // (2 * dp)
    assert all(len(senders) == 2 for senders in grouping(2 * dp, dp).values())


def test_worker_configs_carry_the_root_values_not_their_own_defaults():
    cfg = load(
        "max_head_offpolicyness=2",
        "groups_per_step=8",
        "schedule_policy=least_requests",
        "seed=7",
        "stall_timeout=33",
        "rollout.request_timeout=44",
    )
    specs = {s.worker_type: s.configs[0] for s in initial_setup(cfg)}
    manager, model, master = specs["gserver_manager"], specs["model_worker"], specs["master_worker"]
    rollout, server = specs["rollout_worker"], specs["generation_server"]
    assert manager.max_head_offpolicyness == model.max_head_offpolicyness == 2
    assert manager.groups_per_step == master.groups_per_step == 8
    assert manager.schedule_policy == "least_requests"
    assert model.seed == rollout.seed == server.seed == 7
    assert master.stall_timeout == 33 and rollout.request_timeout == 44
    assert model.ppo.kl_ctl == master.ppo.kl_ctl == 0.1  # the YAML's value, not the dataclass default 0.0
    assert master.total_train_steps == model.total_train_steps == 350


def test_worker_config_defaults_are_the_root_defaults():
    """A worker field that carries a root fact has the root's default: one default per fact."""
    import dataclasses

    from realhf.api import worker_configs

    root = AsyncPPOConfig()
    pairs = [
        (worker_configs.GserverManagerConfig, "max_head_offpolicyness", root.max_head_offpolicyness),
        (worker_configs.ModelWorkerConfig, "max_head_offpolicyness", root.max_head_offpolicyness),
        (worker_configs.GserverManagerConfig, "groups_per_step", root.groups_per_step),
        (worker_configs.MasterWorkerConfig, "groups_per_step", root.groups_per_step),
        (worker_configs.GserverManagerConfig, "max_concurrent_rollouts", root.max_concurrent_rollouts),
        (worker_configs.RolloutWorkerConfig, "group_size", root.group_size),
        (worker_configs.MasterWorkerConfig, "stall_timeout", root.stall_timeout),
    ]
    for cls, name, want in pairs:
        assert getattr(cls(), name) == want, f"{cls.__name__}.{name}"
    assert dataclasses.asdict(worker_configs.ModelWorkerConfig().ppo) == dataclasses.asdict(root.ppo)


def test_a_worker_refuses_a_bad_config_at_its_entry(tmp_path):
    """The same rules hold when a worker is started from a config file written by hand."""
    from realhf.api.worker_configs import GserverManagerConfig
    from realhf.apps.remote import load_worker

    path = tmp_path / "manager.yaml"
    path.write_text(
        OmegaConf.to_yaml(
            {
                "context": {
                    "experiment_name": "e",
                    "trial_name": "t",
                    "worker_type": "gserver_manager",
                    "worker_index": 0,
                    "worker_count": 1,
                },
                "config": OmegaConf.structured(GserverManagerConfig(schedule_policy="fastest")),
            }
        )
    )
    with pytest.raises(ConfigError, match="gserver_manager.schedule_policy"):
        load_worker(str(path))


USER_PLUGINS = """
from realhf.api.agent import register_agent
from realhf.plugins.agents.math_single_step import MathSingleStepAgent


@register_agent("echo-agent")
class EchoAgent(MathSingleStepAgent):
    pass


def rloo(scores, group_ids):
    return scores
"""


@pytest.mark.system
def test_help_shows_the_values_the_run_will_use_and_the_names_of_the_plug_ins(tmp_path):
    (tmp_path / "my_plugins.py").write_text(USER_PLUGINS)
    proc = subprocess.run(
        [
            sys.executable,
            "training/main_async_ppo.py",
            "--help",
            "max_head_offpolicyness=2",
            f"rollout.agent.type={tmp_path}/my_plugins.py:EchoAgent",  # the user's code, with its registrations
            f"ppo.adv_estimator={tmp_path}/my_plugins.py:rlo",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    # YAML values over the dataclass defaults (0.0, ./runs, 0), and the command line's override.
    assert "ppo.kl_ctl = 0.1\n" in out
    assert "cluster.fileroot = './outputs'\n" in out
    assert "exp_ctrl.benchmark_steps = 350\n" in out
    assert "max_head_offpolicyness = 2\n" in out
    assert "$\\{" not in out
    # The open keys: built-in names, the names the user's code on the command line registered (with
    # its file), and what is wrong with a path that does not load.
    plugins = out.split("\nPlug-ins (")[1]
    assert (
        f"agents: math-single-step, math-multi-turn, tool-agent, openai-agent, echo-agent ({tmp_path}/my_plugins.py)\n"
        in plugins
    )
    assert "environments: math, mcp, code, none\n" in plugins
    assert "rewards: the environment's" in plugins
    assert "policy losses: ppo, gspo, cpgd, gpg\n" in plugins
    assert "advantage estimators: grpo, dr_grpo, batch_norm, gae, reinforce\n" in plugins
    assert (
        f"cannot be loaded: ppo.adv_estimator='{tmp_path}/my_plugins.py:rlo': file {tmp_path}/my_plugins.py has no attribute 'rlo'; did you mean 'rloo'?"
        in plugins
    )


@pytest.mark.system
def test_command_line_rejects_a_bad_value_before_starting_anything(tmp_path):
    proc = subprocess.run(
        [sys.executable, "training/main_async_ppo.py", "max_head_offpolicyness=-2", f"cluster.fileroot={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "max_head_offpolicyness must be >= 0" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


def test_benchmark_steps_win_over_epochs_and_an_epoch_is_dataset_size_over_b():
    cfg = AsyncPPOConfig(groups_per_step=16, exp_ctrl=ExperimentSaveEvalControl(total_train_epochs=2))
    assert total_train_steps(cfg, n_rows=100) == 12  # 100 // 16 = 6 steps per epoch
    cfg.exp_ctrl.benchmark_steps = 5
    assert total_train_steps(cfg, n_rows=100) == 5


def test_every_root_number_a_worker_carries_reaches_it():
    """Each worker field declared `same_as(<root field>)` gets the run's value of that field, not
    its default: change every such int/float root value and look at every worker's config."""
    import dataclasses

    from realhf.api import worker_configs

    def root_field(path):
        cls = AsyncPPOConfig
        for part in path.split("."):
            f = {x.name: x for x in dataclasses.fields(cls)}[part]
            cls = f.default_factory if f.default_factory is not dataclasses.MISSING else f.type
        return f

    carried = {}  # root path -> [(worker config class, field)]
    for cls in (
        worker_configs.GenerationServerConfig,
        worker_configs.GserverManagerConfig,
        worker_configs.RolloutWorkerConfig,
        worker_configs.ModelWorkerConfig,
        worker_configs.MasterWorkerConfig,
    ):
        for f in dataclasses.fields(cls):
            if "root" in f.metadata:
                carried.setdefault(f.metadata["root"], []).append((cls, f.name))
    defaults = load()
    changed = {}
    for path in carried:
        value = defaults
        for part in path.split("."):
            value = getattr(value, part)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        changed[path] = value * 2 if value else 3  # doubling keeps every range and divisibility rule
        if path == "groups_per_step":
            changed[path] = value  # the allocation's DP shares depend on it; checked elsewhere
    assert "cluster.max_message_bytes" in changed and "max_head_offpolicyness" in changed
    cfg = load(*(f"{p}={v}" for p, v in changed.items()))
    by_class = {type(c): c for spec in initial_setup(cfg) for c in spec.configs}
    wrong = [
        f"{cls.__name__}.{name} = {getattr(by_class[cls], name)!r}, root {path} = {want!r}"
        for path, want in changed.items()
        for cls, name in carried[path]
        if cls in by_class and getattr(by_class[cls], name) != want
    ]
    assert not wrong, "\n".join(wrong)


def test_master_carries_the_whole_config_for_wandb_through_its_config_file(tmp_path):
    from realhf.api.worker_configs import MasterWorkerConfig

    assert next(s for s in initial_setup(load()) if s.worker_type == "master_worker").configs[0].run_config == {}
    cfg = load("stats.wandb_project=p", "seed=5", "cluster.name_resolve.redis_url=redis://:pw@127.0.0.1:1/0")
    master = next(s for s in initial_setup(cfg) if s.worker_type == "master_worker").configs[0]
    # Written and read the way the launcher and realhf.apps.remote do.
    path = tmp_path / "master.yaml"
    OmegaConf.save(OmegaConf.structured(master), path)
    read = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(MasterWorkerConfig), OmegaConf.load(path)))
    assert read.run_config["seed"] == 5 and read.run_config["ppo"]["kl_ctl"] == cfg.ppo.kl_ctl
    assert read.run_config["cluster"]["name_resolve"]["redis_url"] == "redis://:***@127.0.0.1:1/0"
