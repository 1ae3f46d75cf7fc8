"""What the Ray launcher asks of Ray for each worker (no cluster needed), and how it is chosen."""

from realhf.api.cli_args import ClusterSpecConfig, RayClusterConfig, RayResourcesConfig
from realhf.scheduler.factory import make_launcher
from realhf.scheduler.local import LocalLauncher
from realhf.scheduler.ray import RayLauncher
from realhf.scheduler.worker_spec import WorkerSpec


def test_the_launcher_is_chosen_by_cluster_launcher(tmp_path):
    assert isinstance(make_launcher(ClusterSpecConfig(fileroot=str(tmp_path)), "e", "t"), LocalLauncher)
    ray_cfg = RayClusterConfig(placement_timeout=7)
    launcher = make_launcher(ClusterSpecConfig(fileroot=str(tmp_path), launcher="ray", ray=ray_cfg), "e", "t")
    assert isinstance(launcher, RayLauncher) and launcher.ray_config.placement_timeout == 7


def test_a_worker_holds_its_threads_gpus_and_custom_resources(tmp_path):
    resources = RayResourcesConfig(model_worker={"node_b": 1.0})
    launcher = RayLauncher("e", "t", str(tmp_path), ray_config=RayClusterConfig(resources=resources))
    assert launcher.bundle(WorkerSpec("model_worker", 2, cpus=2, gpus=1)) == {"CPU": 2.0, "GPU": 1.0, "node_b": 1.0}
    # Ray refuses an empty bundle: a worker that declares no CPU holds a sliver of one.
    assert launcher.bundle(WorkerSpec("master_worker", 1)) == {"CPU": 0.01}


def test_a_shared_gpu_is_asked_for_as_a_fraction_not_rounded(tmp_path):
    launcher = RayLauncher("e", "t", str(tmp_path))
    assert launcher.bundle(WorkerSpec("generation_server", 1, cpus=1, gpus=0.5)) == {"CPU": 1.0, "GPU": 0.5}
    assert launcher.bundle(WorkerSpec("model_worker", 1, cpus=1, gpus=0.25))["GPU"] == 0.25
