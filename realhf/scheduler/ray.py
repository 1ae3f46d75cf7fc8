"""The Ray launcher: the same workers, supervised the same way, placed on the nodes of a Ray cluster.

    python training/main_async_ppo.py cluster.launcher=ray [cluster.ray.address=HOST:PORT]

Each worker runs as the same subprocess as under the local launcher (`worker_process.py`), but
started by a small Ray actor, `ProcessHost`, on the node Ray chose for it. The actor holds the
worker's Ray resources (CPUs, GPUs, `cluster.ray.resources` of its type) for as long as the
worker lives; trainer ranks and generation servers (`WorkerSpec.placement_group`) are placed
through one placement group per worker type, so a DP group may span nodes. Supervision — exit
codes, heartbeats, restarts, failures named with their log tail, SIGINT/SIGTERM — is the
`Supervisor`'s, exactly as for the local launcher; the actor only answers it (poll, kill,
stop). Each actor also runs a watchdog of its own (`watchdog.py`), so the worker's children on
its node are swept when the actor dies, whatever killed it.

Cluster lifecycle: without `cluster.ray.address` the launcher starts a Ray cluster on this
machine for the run (`ray.init(address="local")`, never connecting to whatever else runs here)
and `ray.shutdown()` stops exactly that at the end; Ray's daemons carry the trial's marker, so
the launcher's watchdog sweeps them if the launcher is SIGKILLed. With an address it connects,
places its actors, and at the end kills its actors and removes its placement groups, leaving the
cluster running.

On a cluster of several nodes, workers bind to their node's address instead of loopback (when
`cluster.bind_host` is loopback; every socket and endpoint requires the trial's secret), Redis
binds to the launcher's node, and the launcher checks first that every node sees the same
`cluster.fileroot` (published weights, checkpoints and logs travel through it). Every node needs
realhf installed with the same Python environment at the same paths; workers start in the
launcher's working directory, so relative paths in the config mean the same everywhere, and import
the user's code from it and from `user_paths` (realhf.base.importing), which every node must see too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import uuid
from typing import Any, Dict, List, Optional

from realhf.api.cli_args import RayClusterConfig
from realhf.base import logging
from realhf.scheduler.supervisor import Supervisor, _Proc
from realhf.scheduler.watchdog import MARKER_ENV, Watchdog
from realhf.scheduler.worker_process import LocalProcess
from realhf.scheduler.worker_spec import LauncherError, WorkerSpec

logger = logging.getLogger("launcher")

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Config fields that name the address a worker binds (worker_configs.py): replaced by the node's
# address when a multi-node cluster places the worker.
BIND_FIELDS = ("host", "bind_host")
CALL_TIMEOUT = 60.0  # seconds for one call to a worker's ProcessHost actor


def import_ray():
    try:
        import ray
    except ImportError:
        raise LauncherError(
            "cluster.launcher=ray needs Ray, which is not installed: pip install 'realhf[ray]' (or: pip install ray)"
        ) from None
    return ray


class ProcessHost:
    """A worker's stand-in on its node (a Ray actor): its `LocalProcess` and its watchdog."""

    def __init__(self, marker: str):
        self._watchdog = Watchdog(marker)
        self._proc: Optional[LocalProcess] = None

    def node(self) -> Dict[str, str]:
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
        }

    def start(self, config_path: str, log_path: str, env: Dict[str, str], cwd: str, banner: str = "") -> int:
        if self._proc is None:
            self._proc = LocalProcess(config_path, log_path, {**os.environ, **env}, cwd=cwd)
        else:
            self._watchdog.forget(self._proc.pid)
        pid = self._proc.start(banner)
        self._watchdog.track(pid)
        return pid

    def poll(self) -> Optional[int]:
        return self._proc.poll()

    def paused(self) -> Optional[bool]:
        return self._proc.paused()

    def kill_tree(self) -> Optional[int]:
        return self._proc.kill_tree()

    def kill_leftovers(self) -> None:
        self._proc.kill_leftovers()

    def begin_stop(self) -> None:
        if self._proc is not None:
            self._proc.begin_stop()

    def end_stop(self, seconds: float) -> List[int]:
        return self._proc.end_stop(time.monotonic() + seconds) if self._proc is not None else []

    def wait(self, timeout: float) -> Optional[int]:
        return self._proc.wait(timeout)

    def close(self) -> None:
        """Before the actor is killed: the watchdog sweeps what the worker left on this node."""
        self._watchdog.close()


def read_probe(path: str) -> str:
    """What a node sees at `path` (the shared-fileroot check)."""
    try:
        with open(path) as f:
            return f.read()
    except OSError as e:
        return f"<{type(e).__name__}: {e}>"


class RayProcess:
    """The supervisor's handle of a worker under Ray: `LocalProcess`'s methods, answered by the
    worker's ProcessHost actor on its node."""

    def __init__(self, launcher: "RayLauncher", p: _Proc, spec: WorkerSpec, config: Any, env: Dict[str, str]):
        self.launcher, self.name, self.spec = launcher, p.name, spec
        self.p = p
        self.env = {**env, MARKER_ENV: f"{launcher.marker}/{spec.worker_type}-{p.index}"}
        self.config = config
        self.pid = -1
        self.node: Dict[str, str] = {}
        self._stop_ref = None
        self._place()

    # ---- placement --------------------------------------------------------------------------
    def _place(self) -> None:
        ray = self.launcher.ray
        options = self.launcher.actor_options(self.spec, self.p.index)
        self.actor = (
            ray.remote(ProcessHost).options(max_restarts=0, max_concurrency=1, **options).remote(self.env[MARKER_ENV])
        )
        timeout = self.launcher.ray_config.placement_timeout
        try:
            self.node = ray.get(self.actor.node.remote(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise LauncherError(
                f"{self.name} could not be placed on the Ray cluster within {timeout:.0f}s "
                f"(cluster.ray.placement_timeout): it needs {self.launcher.describe_needs(self.spec)}; the cluster "
                f"has {self.launcher.resources(available=True)} available"
            ) from None
        if self.config is not None and self.launcher.node_addresses:
            fields = {f: self.node["ip"] for f in BIND_FIELDS if hasattr(self.config, f)}
            self.config = dataclasses.replace(self.config, **fields)

    @property
    def where(self) -> str:
        return (
            f" on node {self.node.get('hostname', '?')}/{self.node.get('ip', '?')} {self.node.get('node_id', '?')[:8]}"
        )

    def _call(self, what: str, *args, timeout: float = CALL_TIMEOUT):
        ray = self.launcher.ray
        try:
            return ray.get(getattr(self.actor, what).remote(*args), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise LauncherError(
                f"{self.name}: its Ray actor{self.where} did not answer {what}() within {timeout:.0f}s"
            ) from None

    def _actor_dead(self, e: Exception) -> None:
        logger.warning(f"{self.name}: its Ray actor{self.where} died ({type(e).__name__}); the worker is gone with it")
        self.actor = None

    # ---- LocalProcess's methods -------------------------------------------------------------
    def start(self, banner: str = "") -> int:
        if self.actor is None:  # the actor (or its node) died: a new one, in the same bundle
            old_ip = self.node.get("ip")
            self._place()
            if self.node.get("ip") != old_ip and self.config is not None:
                self.launcher.rewrite_config(self.p, self.config)
        self.pid = self._call("start", self.p.config_path, self.p.log_path, self.env, self.launcher.launch_dir, banner)
        return self.pid

    def poll(self) -> Optional[int]:
        if self.actor is None:
            return -9
        try:
            return self._call("poll")
        except self.launcher.ray.exceptions.RayActorError as e:
            self._actor_dead(e)
            return -9  # as if SIGKILLed: the restart policy treats it like any death

    def paused(self) -> Optional[bool]:
        try:
            return self._call("paused") if self.actor is not None else None
        except self.launcher.ray.exceptions.RayActorError:
            return None

    def kill_tree(self) -> Optional[int]:
        try:
            return self._call("kill_tree") if self.actor is not None else -9
        except self.launcher.ray.exceptions.RayActorError as e:
            self._actor_dead(e)
            return -9

    def kill_leftovers(self) -> None:
        try:
            if self.actor is not None:
                self._call("kill_leftovers")
        except self.launcher.ray.exceptions.RayActorError as e:
            self._actor_dead(e)

    def begin_stop(self) -> None:
        if self.actor is not None:
            self._stop_ref = self.actor.begin_stop.remote()

    def end_stop(self, deadline: float) -> List[int]:
        if self.actor is None:
            return []
        ray = self.launcher.ray
        try:
            if self._stop_ref is not None:
                ray.get(self._stop_ref, timeout=CALL_TIMEOUT)
            return self._call("end_stop", max(0.0, deadline - time.monotonic()))
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError, LauncherError) as e:
            logger.warning(f"{self.name}: stopping through its Ray actor failed ({type(e).__name__}: {e})")
            return []

    def wait(self, timeout: float) -> Optional[int]:
        if self.actor is None:
            return -9
        try:
            return self._call("wait", timeout, timeout=timeout + CALL_TIMEOUT)
        except (self.launcher.ray.exceptions.RayActorError, LauncherError):
            return None

    def close(self) -> None:
        """Sweep the worker's node (the actor's watchdog) and end the actor."""
        if self.actor is None:
            return
        ray = self.launcher.ray
        try:
            ray.get(self.actor.close.remote(), timeout=CALL_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - the actor is killed below in any case
            logger.warning(f"{self.name}: closing its Ray actor failed ({type(e).__name__})")
        ray.kill(self.actor, no_restart=True)
        self.actor = None


class RayLauncher(Supervisor):
    launcher_name = "ray"
    assigns_gpus = True  # Ray narrows CUDA_VISIBLE_DEVICES to an actor's own GPUs

    def __init__(self, *args, ray_config: Optional[RayClusterConfig] = None, **kw):
        super().__init__(*args, **kw)
        self.ray_config = ray_config or RayClusterConfig()
        self.ray = None
        self.node_addresses = False  # workers bind to their node's address (a multi-node cluster)
        self._own_cluster = False
        self._groups: Dict[str, Any] = {}  # worker type -> its placement group
        self._daemons: Dict[int, float] = {}  # pid -> start time of Ray processes told to the watchdog
        self.startup_seconds = 0.0

    # ---- the cluster ------------------------------------------------------------------------
    def start(self) -> "RayLauncher":
        t0 = time.monotonic()
        self.ray = import_ray()
        rc = self.ray_config
        if self.ray.is_initialized():
            raise LauncherError(
                "Ray is already initialized in this process; the Ray launcher connects (or starts a cluster) itself"
            )
        if rc.address:
            logger.info(f"connecting to the Ray cluster at {rc.address}")
            self._init(address=rc.address)
        else:
            # Ray's daemons inherit this marker: the launcher's watchdog (started below by
            # Supervisor.start) sweeps them if the launcher dies before ray.shutdown().
            os.environ[MARKER_ENV] = self.marker
            try:
                self._init(
                    address="local",
                    num_cpus=rc.num_cpus or os.cpu_count(),
                    num_gpus=rc.num_gpus,
                    include_dashboard=False,
                )
            finally:
                os.environ.pop(MARKER_ENV, None)
            self._own_cluster = True
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        if len(nodes) > 1:
            self.check_shared_fileroot(nodes)
            if self.bind_host in LOOPBACK:
                self.node_addresses = True
                self.bind_host = self.ray.util.get_node_ip_address()  # Redis, reached from every node
        logger.info(
            f"Ray cluster {'started for this run' if self._own_cluster else 'joined'}: {len(nodes)} node(s), "
            f"{self.resources()}; "
            + ("workers bind to their node's address" if self.node_addresses else f"binding {self.bind_host}")
        )
        try:
            super().start()
        except BaseException:
            self._stop_cluster()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def _init(self, **kw) -> None:
        try:
            self.ray.init(log_to_driver=False, namespace=f"realhf-{self.experiment_name}-{self.trial_name}", **kw)
        except (ConnectionError, RuntimeError, ValueError) as e:
            where = f"cluster.ray.address={kw['address']!r}" if kw.get("address") != "local" else "a new local cluster"
            raise LauncherError(f"Ray could not start or join {where}: {type(e).__name__}: {e}") from None

    def check_shared_fileroot(self, nodes: List[dict]) -> None:
        """Every node must see the file the launcher writes under the trial's log directory."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        os.makedirs(self.log_dir, exist_ok=True)
        token = uuid.uuid4().hex
        probe = os.path.join(os.path.abspath(self.log_dir), f".shared-fileroot-probe-{token[:8]}")
        with open(probe, "w") as f:
            f.write(token)
        try:
            reader = ray.remote(num_cpus=0)(read_probe)
            refs = {
                n["NodeID"]: reader.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(probe)
                for n in nodes
            }
            try:
                seen = dict(zip(refs, ray.get(list(refs.values()), timeout=self.ray_config.placement_timeout)))
            except ray.exceptions.GetTimeoutError:
                raise LauncherError(
                    f"the shared-fileroot check did not finish within "
                    f"{self.ray_config.placement_timeout:.0f}s (cluster.ray.placement_timeout)"
                ) from None
        finally:
            os.unlink(probe)
        blind = [
            f"{n['NodeManagerAddress']} ({n['NodeID'][:8]}): {seen[n['NodeID']][:120]}"
            for n in nodes
            if seen[n["NodeID"]] != token
        ]
        if blind:
            raise LauncherError(
                f"cluster.fileroot must be one directory shared by every node of the Ray cluster (published weights, "
                f"checkpoints and logs travel through it), but {len(blind)} of {len(nodes)} nodes do not see {probe}, "
                f"which the launcher just wrote: " + "; ".join(blind)
            )

    def actor_options(self, spec: WorkerSpec, index: int) -> Dict[str, Any]:
        """Ray options of worker `index` of `spec`: its resources, or its placement-group bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        needs = self.bundle(spec)
        options = {"num_cpus": needs.pop("CPU"), "num_gpus": needs.pop("GPU", 0), "resources": needs}
        if spec.placement_group:
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self._group(spec), index)
        elif spec.cpus <= 0:
            options["num_cpus"] = 0  # outside a placement group nothing forces a sliver
        return options

    def bundle(self, spec: WorkerSpec) -> Dict[str, float]:
        """What one worker of `spec` holds while it lives. Ray refuses an empty bundle, hence a
        sliver of a CPU for workers that declare none."""
        needs = {"CPU": float(spec.cpus) if spec.cpus > 0 else 0.01}
        if spec.gpus > 0:
            needs["GPU"] = float(spec.gpus)
        custom = getattr(self.ray_config.resources, spec.worker_type, None) or {}
        needs.update({k: float(v) for k, v in custom.items()})
        return needs

    def resources(self, available: bool = False) -> Dict[str, float]:
        """The cluster's resources as a user declared them (not Ray's per-placement-group entries)."""
        found = self.ray.available_resources() if available else self.ray.cluster_resources()
        return {
            k: v
            for k, v in sorted(found.items())
            if "_group_" not in k and not k.startswith("node:") and k not in ("memory", "object_store_memory")
        }

    def describe_needs(self, spec: WorkerSpec) -> str:
        return f"{self.bundle(spec)} (cluster.ray.resources.{spec.worker_type} adds custom ones)"

    def _group(self, spec: WorkerSpec):
        if spec.worker_type in self._groups:
            return self._groups[spec.worker_type]
        from ray.util.placement_group import placement_group

        strategy = self.ray_config.placement_strategy
        group = placement_group(
            [self.bundle(spec) for _ in range(spec.count)],
            strategy=strategy,
            name=f"{self.experiment_name}/{self.trial_name}/{spec.worker_type}",
        )
        self._groups[spec.worker_type] = group
        timeout = self.ray_config.placement_timeout
        try:
            self.ray.get(group.ready(), timeout=timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise LauncherError(
                f"the placement group of {spec.count} {spec.worker_type} worker(s) ({strategy}, each "
                f"{self.describe_needs(spec)}) was not placed within {timeout:.0f}s (cluster.ray.placement_timeout); "
                f"the cluster has {self.resources()} in all, {self.resources(available=True)} available"
            ) from None
        return group

    def _new_process(self, p: _Proc, spec: WorkerSpec, config: Any, env: Dict[str, str]) -> RayProcess:
        passed = {k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}  # the launcher's import path
        return RayProcess(self, p, spec, config, {**passed, **env})

    def placement(self) -> Dict[str, Dict[str, Any]]:
        """Where every worker runs: {"<type>/<index>": {node_id, ip, hostname, pid}}."""
        return {p.name: {**p.process.node, "pid": p.process.pid} for p in self._procs}

    def _process_started(self, p: _Proc) -> None:
        if self._own_cluster:
            self._track_ray_daemons()
        # <log_dir>/placement.json: which node and pid each worker has now (rewritten on restarts).
        path = os.path.join(self.log_dir, "placement.json")
        with open(path + ".tmp", "w") as f:
            json.dump(self.placement(), f, indent=1)
        os.replace(path + ".tmp", path)

    def _track_ray_daemons(self) -> None:
        """Hand the Ray processes this launcher started to its watchdog one by one. Most carry
        the trial's marker, but Ray's agents rewrite their process title over their environment
        block, and after a SIGKILLed launcher they would linger for minutes."""
        import psutil

        for proc in psutil.Process().children(recursive=True):
            if proc.pid not in self._daemons and proc.pid != self._watchdog.pid:
                try:
                    self._daemons[proc.pid] = proc.create_time()
                except psutil.Error:
                    continue
                self._watchdog.track_process(proc.pid, self._daemons[proc.pid])

    def _stop_cluster(self) -> None:
        if self.ray is None or not self.ray.is_initialized():
            return
        for p in self._procs:
            p.process.close()
        from ray.util.placement_group import remove_placement_group

        for group in self._groups.values():
            try:
                remove_placement_group(group)
            except Exception as e:  # noqa: BLE001 - the cluster may be going away with us
                logger.warning(f"could not remove a placement group: {e}")
        self._groups.clear()
        self.ray.shutdown()  # stops the cluster if this launcher started it; disconnects otherwise
