"""`cluster.launcher` → the launcher that runs a trial (Ray imported only when chosen)."""

from typing import Sequence

from realhf.api.cli_args import ClusterSpecConfig
from realhf.scheduler.supervisor import Supervisor


def make_launcher(
    cluster: ClusterSpecConfig, experiment_name: str, trial_name: str, user_paths: Sequence[str] = ()
) -> Supervisor:
    common = dict(
        name_resolve_config=cluster.name_resolve,
        bind_host=cluster.bind_host,
        user_paths=user_paths,
        stop_grace=cluster.stop_grace,
        clear_keys=True,  # an external Redis outlives the run: leave nothing of it there
    )
    if cluster.launcher == "ray":
        from realhf.scheduler.ray import RayLauncher

        return RayLauncher(experiment_name, trial_name, cluster.fileroot, ray_config=cluster.ray, **common)
    from realhf.scheduler.local import LocalLauncher

    return LocalLauncher(
        experiment_name, trial_name, cluster.fileroot, fork_workers=cluster.fork_workers,
        worker_template=cluster.worker_template, **common,
    )  # fmt: skip
