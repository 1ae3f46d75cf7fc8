"""The run's GPU placement as the workers receive it (realhf.experiments.gpu_layout and
initial_setup): each generation server's and trainer rank's GPU and memory share, what Ray is
asked for, and the layouts refused before any process starts. The placement rule itself:
tests/unit/base/test_placement.py."""

import subprocess
import sys

import pytest

from helpers.paths import REPO
from realhf.experiments.async_ppo import initial_setup
from realhf.experiments.config_loading import compose_config
from realhf.experiments.gpu_layout import gpus_per_node
from realhf.experiments.validation import ConfigError

ONE_GPU = ("allocation_mode=native.d1m1p1+d1m1p1", "cluster.n_gpus_per_node=1")


@pytest.fixture(autouse=True)
def _repo_cwd(monkeypatch):
    monkeypatch.chdir(REPO)  # the YAML's paths are relative to the repository root


def _torch_sees(monkeypatch, n: int) -> None:
    """What torch reports about GPUs, whatever this machine has (a GPU build of torch, when n > 0)."""
    import torch

    from realhf.experiments import gpu_layout

    monkeypatch.setattr(gpu_layout, "torch_built_for_gpu", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def built(*overrides):
    """{worker type: its WorkerSpec} of the experiment the overrides describe."""
    return {s.worker_type: s for s in initial_setup(compose_config(list(overrides)))}


def test_one_gpu_shared_gives_the_server_and_the_trainer_gpu_0_at_half_its_memory_each():
    specs = built(*ONE_GPU, "cluster.gpu_placement=shared")
    (server,), (rank,) = specs["generation_server"].configs, specs["model_worker"].configs
    assert (server.base_gpu_id, server.gpu_memory_fraction) == (0, 0.5)
    assert (rank.gpu, rank.gpu_memory_fraction) == (0, 0.5)
    # On a Ray cluster each holds half a GPU, not a whole one rounded.
    assert specs["generation_server"].gpus == 0.5 and specs["model_worker"].gpus == 0.5


def test_one_gpu_by_default_is_shared_too():
    specs = built(*ONE_GPU)
    assert specs["model_worker"].configs[0].gpu == 0 and specs["model_worker"].configs[0].gpu_memory_fraction == 0.5


def test_gen_memory_fraction_sets_the_split():
    specs = built(*ONE_GPU, "cluster.gen_memory_fraction=0.75")
    assert specs["generation_server"].configs[0].gpu_memory_fraction == 0.75
    assert specs["model_worker"].configs[0].gpu_memory_fraction == pytest.approx(0.25)


def test_separate_on_one_gpu_is_refused_naming_the_numbers():
    with pytest.raises(ConfigError) as info:
        initial_setup(compose_config([*ONE_GPU, "cluster.gpu_placement=separate"]))
    message = str(info.value)
    assert "cluster.gpu_placement=separate needs 1 GPUs for generation + 1 for the trainer = 2" in message
    assert "1 node(s) × 1 GPUs = 1" in message and "cluster.gpu_placement=shared (or auto)" in message


@pytest.mark.system
def test_separate_on_one_gpu_is_refused_before_any_process_starts(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "training/main_async_ppo.py",
            *ONE_GPU,
            "cluster.gpu_placement=separate",
            f"cluster.fileroot={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "config error: allocation_mode:" in proc.stderr and "gpu_placement=separate needs" in proc.stderr
    assert not (tmp_path / "logs").exists()  # nothing was launched


def test_two_gpus_keep_the_server_on_gpu_0_and_the_trainer_on_gpu_1():
    specs = built("allocation_mode=native.d1+d1", "cluster.n_gpus_per_node=2")
    server, rank = specs["generation_server"].configs[0], specs["model_worker"].configs[0]
    assert (server.base_gpu_id, server.gpu_memory_fraction) == (0, 1.0)
    assert (rank.gpu, rank.gpu_memory_fraction) == (1, 1.0)
    assert specs["generation_server"].gpus == 1.0 and specs["model_worker"].gpus == 1.0


def test_every_trainer_rank_gets_its_own_gpu():
    specs = built(
        "allocation_mode=native.d1+d2", "cluster.n_gpus_per_node=4", "rollout.n_workers=2", "groups_per_step=16"
    )
    assert [c.gpu for c in specs["model_worker"].configs] == [1, 2]


def test_the_cpu_run_holds_no_gpu():
    specs = built("allocation_mode=native.d2+d2", "cluster.device=cpu", "cluster.n_gpus_per_node=8")
    assert specs["generation_server"].gpus == 0 and specs["model_worker"].gpus == 0
    assert all(c.gpu_memory_fraction == 1.0 for c in specs["model_worker"].configs)


# ---- how many GPUs a node lends -----------------------------------------------------------------


def test_gpus_per_node_is_the_declared_count_or_what_torch_sees_when_a_gpu_is_asked_for(monkeypatch):
    def count(*overrides):
        return gpus_per_node(compose_config(list(overrides)))

    _torch_sees(monkeypatch, 2)
    assert count("cluster.n_gpus_per_node=4") == 4  # declared wins (a Ray head may have none)
    assert count("cluster.device=auto") == 2 and count("cluster.device=cuda") == 2
    assert count("cluster.device=cpu") == 0 and count("cluster.device=cpu", "cluster.n_gpus_per_node=4") == 0
    _torch_sees(monkeypatch, 0)
    assert count("cluster.device=auto") == 0


def test_a_machine_with_one_gpu_and_no_declared_count_shares_it_instead_of_asking_for_cuda_1(monkeypatch):
    # Issue 30: with n_gpus_per_node left at 0 the trainer used to be placed after the server, on cuda:1.
    _torch_sees(monkeypatch, 1)
    specs = built("allocation_mode=native.d1+d1", "cluster.device=auto")
    assert specs["generation_server"].configs[0].base_gpu_id == 0 and specs["model_worker"].configs[0].gpu == 0
    assert specs["model_worker"].configs[0].gpu_memory_fraction == 0.5


# ---- Ray: it picks each worker's GPU, from the fractions it is asked for -------------------------


def test_under_ray_every_worker_of_a_role_asks_for_and_keeps_to_the_roles_share():
    # 2 servers + 1 rank on 2 GPUs: server 1 would have GPU 1 alone, but Ray may put it anywhere.
    specs = built(
        "allocation_mode=native.d2+d1", "cluster.n_gpus_per_node=2", "cluster.launcher=ray", "rollout.n_workers=1"
    )
    assert [c.gpu_memory_fraction for c in specs["generation_server"].configs] == [0.5, 0.5]
    assert specs["generation_server"].gpus == 0.5 and specs["model_worker"].gpus == 0.5


def test_under_ray_a_server_of_several_gpus_cannot_share_them():
    with pytest.raises(ConfigError) as info:
        built("allocation_mode=sglang.d1m2+d2", "cluster.n_gpus_per_node=2", "cluster.launcher=ray")
    message = str(info.value)
    assert message.startswith("cluster.launcher=ray: generation server 0 would share its 2 GPUs (m2 p1)")
    assert "Ray lends a fraction of one GPU only" in message


# ---- the fields ----------------------------------------------------------------------------------


def test_an_unknown_gpu_placement_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"^cluster\.gpu_placement='packed': choose one of \['auto', 'separate'"):
        initial_setup(compose_config(["cluster.gpu_placement=packed"]))


def test_sglang_with_the_run_on_the_cpu_is_refused_naming_cluster_device():
    with pytest.raises(ConfigError, match="the sglang engine runs on GPUs, but cluster.device=cpu"):
        initial_setup(compose_config(["allocation_mode=sglang.d1+d1", "cluster.device=cpu"]))


def test_a_worker_config_with_a_gpu_share_out_of_range_is_refused_at_its_entry():
    from helpers.paths import TINY_MATH
    from realhf.api.cli_args import ModelTrainEvalConfig
    from realhf.api.worker_configs import GenerationServerConfig, ModelWorkerConfig
    from realhf.experiments.worker_validation import validate_worker_config

    with pytest.raises(ConfigError, match=r"^generation_server\.gpu_memory_fraction must lie in \(0, 1\], got 0"):
        validate_worker_config(GenerationServerConfig(model_path="/m", gpu_memory_fraction=0))
    actor = ModelTrainEvalConfig(path=f"{TINY_MATH}/sft")
    with pytest.raises(ConfigError, match=r"^gpu must be >= 0, got -1"):
        validate_worker_config(ModelWorkerConfig(actor=actor, gpu=-1))
    with pytest.raises(ConfigError, match=r"^gpu_memory_fraction must lie in \(0, 1\], got 1.5"):
        validate_worker_config(ModelWorkerConfig(actor=actor, gpu_memory_fraction=1.5))
