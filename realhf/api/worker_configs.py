"""The config of each worker process, derived from the root config by `realhf.experiments`.

A field that carries a fact of the root tree (`realhf.api.cli_args.AsyncPPOConfig`) is
declared with `same_as("<root field>")`: it takes the root's default and help, so a fact has
one default however many workers read it, and `from_root` fills it with the run's value, so the
experiment never copies a root fact by hand (a worker config lists the slice of the root it
reads; adding a root knob a worker needs is one `same_as` line there). The remaining fields are a worker's own mechanics
(poll intervals, discovery timeouts) or values the experiment computes (a worker's share of the
rollouts, the trial's run directory); their rules live in `realhf.experiments.validation`.
"""

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Type, TypeVar

from realhf.api.cli_args import (
    AgentConfig,
    AsyncPPOConfig,
    DatasetColumnsConfig,
    EnvConfig,
    ExperimentSaveEvalControl,
    GenerationHyperparameters,
    ModelTrainEvalConfig,
    NativeEngineConfig,
    PPOHyperparameters,
    SGLangConfig,
    StatsLoggingConfig,
    VLLMConfig,
    _f,
)

W = TypeVar("W")


def _root_field(path: str) -> dataclasses.Field:
    cls, f = AsyncPPOConfig, None
    for part in path.split("."):
        f = next((x for x in dataclasses.fields(cls) if x.name == part), None)
        if f is None:
            raise AttributeError(f"{path!r} is not a field of AsyncPPOConfig")
        cls = f.default_factory if f.default_factory is not dataclasses.MISSING else f.type
    return f


def root_value(root: AsyncPPOConfig, path: str) -> Any:
    """The value of the root config's field `path` (dotted), copied so a worker never shares
    (and mutates) the root's objects."""
    value: Any = root
    for part in path.split("."):
        value = getattr(value, part)
    return copy.deepcopy(value)


def from_root(cls: Type[W], root: AsyncPPOConfig, **own: Any) -> W:
    """A worker config of class `cls` whose `same_as` fields carry the run's root values: the
    one place a root fact is handed to a worker (`own` sets the worker's other fields: its
    share of the work, the trial's directories)."""
    carried = {
        f.name: root_value(root, f.metadata["root"])
        for f in dataclasses.fields(cls)
        if "root" in f.metadata and f.name not in own
    }
    return cls(**carried, **own)


def same_as(path: str, help: str = "") -> Any:
    """A worker field carrying the root config's fact `path`: the root's default and help."""
    f = _root_field(path)
    text = help or f"{f.metadata.get('help', '')} (root: {path})"
    meta = {"help": text, "root": path}  # "root": tests check that the experiment passes it on
    if "rule" in f.metadata:  # the root's rule, declared once, checked on the worker's copy too
        meta["rule"] = f.metadata["rule"]
    if f.default_factory is not dataclasses.MISSING:
        return field(default_factory=f.default_factory, metadata=meta)
    return field(default=f.default, metadata=meta)


@dataclass
class GenerationServerConfig:
    """One generation server: an engine behind the SGLang HTTP protocol (docs/architecture.md §5)."""

    backend: str = _f("native", "'native' (built-in engine), 'sglang' or 'vllm' (the <engine> of allocation_mode).")
    model_path: str = same_as("actor.path", "HF directory (config.json + safetensors) of the initial weights.")
    host: str = same_as("cluster.bind_host")
    device: str = same_as("cluster.device")
    port: int = _f(0, "HTTP port; 0: a free port.")
    max_request_bytes: int = same_as("cluster.max_request_bytes")
    native: NativeEngineConfig = same_as("gen_server.native", "The built-in engine (backend=native).")
    sglang: SGLangConfig = same_as("gen_server.sglang", "SGLang server arguments (backend=sglang).")
    vllm: VLLMConfig = same_as("gen_server.vllm", "vLLM as the engine (backend=vllm).")
    tp_size: int = _f(1, "Tensor parallelism of the sglang backend (native: must be 1).")
    base_gpu_id: int = _f(
        0,
        "This server's first GPU on its node (realhf.base.placement; sglang: its first tensor-parallel GPU, the next tp_size - 1 follow; native: its device). Unused on the CPU, and where the launcher gives the process its own GPUs (Ray): then device 0.",
    )
    gpu_memory_fraction: float = _f(
        1.0,
        "Fraction of its GPUs' memory this server may use (realhf.base.placement): below 1 where it shares a GPU with a trainer rank (native: torch's per-process cap; sglang: scales sglang.mem_fraction_static).",
    )
    seed: int = same_as("seed", "Sampler seed; server i uses seed + i (overrides native.seed).")
    weight_version: int = _f(0, "Weight version reported until the first update_weights_from_disk.")
    startup_timeout: float = _f(
        120.0, "Seconds the native backend may take to serve /health (sglang: sglang.startup_timeout)."
    )
    health_check_interval: float = _f(
        2.0, "Seconds between liveness checks of the backend; a dead backend fails the worker."
    )
    health_timeout: float = _f(
        10.0,
        "Seconds one liveness check may take: /health of the sglang backend, a no-op command through the native engine thread.",
    )
    max_health_failures: int = _f(
        3,
        "Consecutive liveness checks that timed out (a hung engine or server) before the worker exits non-zero, so the launcher restarts it.",
    )
    keepalive_ttl: float = _f(10.0, "Seconds before this server's gen_servers/ entry expires if the process dies.")
    weights_root: str = _f(
        "",
        "The role's published-weights directory: on start, serve the version named by model_version/<role> from here (a restarted server rejoins current); empty: model_path.",
    )
    model_role: str = _f("actor", "Role whose model_version a (re)starting server loads from weights_root.")


@dataclass
class GserverManagerConfig:
    """The GserverManager: admission under the staleness rule, routing, weight updates."""

    host: str = same_as("cluster.bind_host")
    schedule_policy: str = same_as("schedule_policy")
    max_concurrent_rollouts: int = same_as("max_concurrent_rollouts")
    groups_per_step: int = same_as("groups_per_step")
    max_head_offpolicyness: int = same_as("max_head_offpolicyness")
    n_servers: int = _f(1, "Generation servers to wait for under gen_servers/ before serving (allocation_mode).")
    server_urls: List[str] = same_as("gen_server.urls")
    pause_for_update: bool = _f(
        True,
        "Pause each server around its disk update (running requests return aborted); off for built-in engines that keep running requests across a swap (gen_server.native.keep_running_on_update).",
    )
    max_request_bytes: int = same_as("cluster.max_request_bytes")
    n_trainer_ranks: int = _f(
        1,
        "Trainer DP ranks (the DP heads rollout workers push to); admission gives each rank its own budget of its share of groups_per_step.",
    )
    model_role: str = _f("actor", "Role whose model_version the manager watches and loads.")
    weight_sync: str = same_as("weight_sync")
    run_dir: str = _f(
        "", "The trial's run directory; published weights are read from its published_weights/<role>/<version>."
    )
    poll_interval: float = _f(0.25, "Seconds between reads of model_version and stale_dropped (<= 0.5).")
    discovery_timeout: float = _f(300.0, "Seconds to wait for n_servers generation servers to register.")
    update_timeout: float = _f(300.0, "Seconds allowed for one server's pause/update/continue.")
    join_timeout: float = _f(
        120.0,
        "Seconds a server that joins late (restarted, added) may wait, unrouted, for the trainer's current weights before it is logged as overdue (again at 2x, 4x, ...); with no other server routed it is routed after this even if its update from disk failed.",
    )
    log_interval: float = _f(10.0, "Seconds between status log lines.")
    health_check_interval: float = _f(1.0, "Seconds between GET /health of every registered generation server.")
    health_timeout: float = _f(5.0, "Seconds one /health may take before it counts as a failure.")
    max_health_failures: int = _f(
        2, "Consecutive failed health checks that drop a server from routing (until it answers again)."
    )
    trained_groups_at_start: int = _f(
        0, "Groups already trained when the run resumes from a checkpoint; admission counts them as accepted."
    )


@dataclass
class RolloutWorkerConfig:
    """One rollout worker: many concurrent agent episodes over its shard of the prompts."""

    dataset_path: str = same_as(
        "dataset.path", "Prompts (JSONL, parquet or a datasets directory); each worker takes a disjoint shard."
    )
    dataset_columns: DatasetColumnsConfig = same_as("dataset.columns")
    dataset_split: str = same_as("dataset.split")
    dataset_config_name: str = same_as("dataset.config_name")
    chat_template: str = same_as("dataset.chat_template")
    tokenizer_path: str = same_as("actor.path", "HF directory of the tokenizer (the actor's).")
    seed: int = same_as("seed", "Seed of the prompt order (each worker adds its index).")
    agent: AgentConfig = same_as("rollout.agent")
    env: EnvConfig = same_as("rollout.env")
    gconfig: GenerationHyperparameters = same_as("ppo.gen")
    group_size: int = same_as("group_size")
    max_concurrent_rollouts: int = _f(
        16, "This worker's share of the root max_concurrent_rollouts (groups it keeps in flight)."
    )
    new_tokens_per_chunk: int = same_as("new_tokens_per_chunk")
    n_pullers: int = _f(1, "Trainer DP heads receiving trajectories (pushers are grouped over them).")
    max_message_bytes: int = same_as(
        "cluster.max_message_bytes",
        "The trainer's limit on one group's message: a larger group is refused here, its episode failed and counted, instead of vanishing in transit.",
    )
    request_timeout: float = same_as("rollout.request_timeout")
    group_in_one_request: bool = same_as("rollout.group_in_one_request")
    episode_timeout: float = same_as("rollout.episode_timeout")
    sampler_state: str = _f(
        "", "JSON PromptSampler state to resume the prompt order from (set on recovery); empty: the start."
    )
    pending: str = _f(
        "",
        "JSON [[query_id, qid], ...] of prompts pending at the recovery checkpoint (set on recovery; "
        "every worker's: each runs those of its shard first); empty: none.",
    )
    manager_timeout: float = _f(30.0, "Seconds allowed for one call to the GserverManager.")
    manager_wait_timeout: float = _f(
        120.0,
        "Seconds a call keeps retrying while the manager is unreachable (killed, being restarted) before it fails.",
    )
    discovery_timeout: float = _f(300.0, "Seconds to wait for the manager and the trajectory puller.")
    push_timeout: float = _f(300.0, "Seconds a push may block on a full trainer queue.")
    max_consecutive_failures: int = _f(20, "Episodes failing in a row before the worker gives up.")
    context_tokens: int = _f(
        0,
        "Tokens a generation server holds per request (prompt + output; validation's server_context): a prompt that is empty or leaves no room for gconfig.max_new_tokens is dropped once and counted. 0: not checked.",
    )
    server_wait_timeout: float = _f(
        300.0,
        "Seconds a request keeps retrying while its generation server is down (killed, restarting) before the episode fails.",
    )
    log_every_groups: int = _f(20, "Log one line per this many finished groups.")


@dataclass
class ModelWorkerConfig:
    """One rank of the trainer; which part of the model and data it holds: realhf.base.trainer_layout."""

    actor: ModelTrainEvalConfig = same_as("actor")
    ref: ModelTrainEvalConfig = same_as("ref")
    critic: ModelTrainEvalConfig = same_as("critic")
    reward: ModelTrainEvalConfig = same_as("reward")
    ppo: PPOHyperparameters = same_as("ppo")
    device: str = same_as("cluster.device")
    tp_size: int = _f(
        1,
        "Tensor parallelism of the trainer (allocation_mode's trainer m): the ranks of one replica split every decoder layer over tp_size ranks; the replica's head receives the trajectories and hands each step's batch to the others (realhf.base.trainer_layout).",
    )
    pp_size: int = _f(
        1,
        "Pipeline stages of the trainer (allocation_mode's trainer p): the ranks of one replica hold consecutive decoder layers (realhf.impl.engine.pipeline_parallel).",
    )
    gpu: int = _f(
        0,
        "This DP rank's GPU on its node (realhf.base.placement). Unused on the CPU, and where the launcher gives the process its own GPU (Ray): then device 0.",
    )
    gpu_memory_fraction: float = _f(
        1.0,
        "Fraction of its GPU's memory this rank may use (torch's per-process cap; realhf.base.placement): below 1 where it shares the GPU with a generation server.",
    )
    run_dir: str = _f("./runs", "The trial's run directory: published_weights/, checkpoints/ and recover/ go under it.")
    bind_host: str = same_as("cluster.bind_host")
    max_message_bytes: int = same_as("cluster.max_message_bytes")
    max_head_offpolicyness: int = same_as("max_head_offpolicyness")
    total_train_steps: int = _f(
        0, "Planned train steps (the LR schedule's horizon is this x ppo_n_minibatches); 0: constant LR."
    )
    seed: int = same_as("seed")
    stream_queue_size: int = _f(4096, "Prompt groups buffered by this DP head before pushers block.")
    keep_last_versions: int = _f(2, "Published weight versions kept per role (older ones are deleted).")
    keep_last_saves: int = same_as("exp_ctrl.keep_last_saves")
    recover: bool = _f(False, "On initialize, resume from the trial's recovery checkpoint if one exists.")
    recover_path: str = _f(
        "",
        "The recovery checkpoint to resume from, verified and chosen by the launcher so that every rank loads the same one (set on recovery); empty: <run_dir>/recover when `recover`.",
    )
    collective_timeout: float = same_as("cluster.collective_timeout")
    weight_sync: str = same_as("weight_sync")
    weight_sync_bucket_mb: int = same_as("weight_sync_bucket_mb")
    weight_sync_backend: str = _f(
        "gloo",
        "Backend of the weight group: 'nccl' only where the trainer and every server have GPUs of their own (NCCL refuses two ranks on one device), else 'gloo'.",
    )
    ranks_per_server: int = _f(
        1, "Ranks each generation server joins the weight group with (its tensor-parallel size)."
    )
    gen_backend: str = _f(
        "native",
        "The generation servers' engine (allocation_mode): SGLang's are paused around a broadcast (it loads each bucket as it arrives); the built-in engine swaps a whole version in at once.",
    )
    disk_every: int = _f(
        0,
        "weight_sync=distributed: versions that are multiples of this are also written to disk (the evaluator's, exp_ctrl.eval_freq_steps); 0: none besides the last and failed ones.",
    )
    distributed_timeout: float = _f(
        300.0,
        "Seconds to wait for the torch.distributed rendezvous, and for another rank's disk writes (HF saves, recovery checkpoints).",
    )
    master_discovery_timeout: float = _f(300.0, "Seconds to wait for the master's request socket in name resolve.")


@dataclass
class NodeWorkerConfig:
    """The node worker: the step's nodes of `ppo.graph.own_process`, on engines of its own."""

    actor: ModelTrainEvalConfig = same_as("actor")
    ref: ModelTrainEvalConfig = same_as("ref")
    critic: ModelTrainEvalConfig = same_as("critic")
    reward: ModelTrainEvalConfig = same_as("reward")
    ppo: PPOHyperparameters = same_as("ppo")
    device: str = same_as("cluster.device")
    seed: int = same_as("seed")
    max_message_bytes: int = same_as("cluster.max_message_bytes")
    stream_index: int = _f(1, "Its index on the master's request socket: after the model workers' (0..n-1).")
    master_discovery_timeout: float = _f(300.0, "Seconds to wait for the master's request socket in name resolve.")


@dataclass
class MasterWorkerConfig:
    n_model_workers: int = _f(1, "Model workers to drive (trainer DP ranks × trainer_tp).")
    n_node_workers: int = _f(0, "Node workers (ppo.graph.own_process): 1 when the step places nodes off the trainer.")
    trainer_tp: int = _f(
        1,
        "Tensor parallelism of the trainer (realhf.base.trainer_layout: which model workers are the DP heads the data goes through).",
    )
    trainer_pp: int = _f(1, "Pipeline stages of the trainer (realhf.base.trainer_layout).")
    groups_per_step: int = same_as("groups_per_step")
    group_size: int = same_as("group_size")
    total_train_steps: int = _f(1, "Train steps of the run (exp_ctrl.benchmark_steps, or epochs x steps per epoch).")
    ppo: PPOHyperparameters = same_as("ppo")
    exp_ctrl: ExperimentSaveEvalControl = same_as("exp_ctrl")
    stats: StatsLoggingConfig = same_as("stats")
    run_config: Dict[str, Any] = _f(
        {},
        "The experiment's whole config as a plain dict, attached to the wandb run (set only when stats.wandb_project is).",
    )
    log_dir: str = _f("./runs/logs", "The trial's log directory: metrics.jsonl goes there.")
    bind_host: str = same_as("cluster.bind_host")
    max_message_bytes: int = same_as("cluster.max_message_bytes")
    stall_timeout: float = same_as("stall_timeout")
    worker_connect_timeout: float = _f(300.0, "Seconds to wait for every model worker to connect.")
    request_timeout: float = _f(1800.0, "Seconds to wait for one reply of a model worker (e.g. a train step).")
    data_poll_interval: float = _f(0.2, "Seconds between 'fetch' polls while waiting for a step's data.")
    data_log_interval: float = _f(30.0, "While waiting for data, log progress every N seconds.")
    catch_up_interval: float = _f(
        2.0,
        "While waiting for data, every N seconds ask the trainer to send its current weights to generation servers that joined since it broadcast them (weight_sync=distributed: a restarted server starts from the newest version on disk). 0: never.",
    )
    expected_workers: Dict[str, int] = _f({}, "Worker counts per type, so a stall report can name the missing ones.")
    data_timeout: float = _f(3600.0, "Fail the run after N seconds without a full batch.")


@dataclass
class EvaluatorConfig:
    """The evaluator: the task's success rate, mean reward and pass@k of the published weights every
    eval_freq_steps versions, in its own niced process (realhf/system/evaluator/evaluator_worker.py). The
    launcher's evaluation before and after training uses the same config (realhf/system/evaluator/task_eval.py)."""

    eval_freq_steps: int = same_as("exp_ctrl.eval_freq_steps")
    test_path: str = same_as("dataset.test_path")
    columns: DatasetColumnsConfig = same_as("dataset.columns")
    test_split: str = same_as("dataset.test_split")
    config_name: str = same_as("dataset.config_name")
    chat_template: str = same_as("dataset.chat_template")
    agent: AgentConfig = same_as("rollout.agent", "The agent the evaluation episodes run (the rollout workers').")
    env: EnvConfig = same_as("rollout.env", "The environment of the evaluation episodes (the rollout workers').")
    gconfig: GenerationHyperparameters = same_as(
        "ppo.gen",
        "Sampling of the evaluation episodes: these, with the evaluation's temperature and max_new_tokens, top_p 1 and top_k off.",
    )
    episode_timeout: float = same_as("rollout.episode_timeout")
    n_prompts: int = same_as("evaluation.during_n_prompts")
    samples: int = same_as("evaluation.during_samples")
    temperature: float = same_as("evaluation.sampled_temperature")
    max_new_tokens: int = same_as("evaluation.max_new_tokens")
    batch_size: int = same_as("evaluation.batch_size", "Requests the evaluator's engine runs at once (its slots).")
    n_threads: int = same_as("evaluation.during_n_threads")
    nice: int = same_as("evaluation.during_nice")
    model_path: str = same_as("actor.path", "HF directory of the tokenizer and of the engine's initial weights.")
    native: NativeEngineConfig = same_as(
        "gen_server.native",
        "The built-in engine the evaluator generates with (its n_threads and max_running_requests are set from n_threads and batch_size).",
    )
    device: str = same_as("cluster.device")
    seed: int = same_as("seed")
    stats: StatsLoggingConfig = same_as("stats")
    model_role: str = _f("actor", "Role whose model_version and published weights are evaluated.")
    run_dir: str = _f(
        "",
        "The trial's run directory: versions are taken from its published_weights/<role>/ and hard-linked under its evaluator/.",
    )
    metrics_path: str = _f("", "Where each evaluation's row is appended (the trial's eval_metrics.jsonl).")
    wandb_run_name: str = _f(
        "", "wandb run of the evaluations (stats.wandb_project set): a run of its own beside the master's."
    )
    resumed_version: int = _f(
        0,
        "The version the run resumed from (set on recovery): rows of later versions in metrics_path belong to steps trained again, and are dropped.",
    )
    answer_timeout: float = _f(
        600.0,
        "Seconds one answer of an evaluation may take in the evaluator's engine before the evaluation fails naming it.",
    )
    poll_interval: float = _f(
        0.25, "Seconds between reads of model_version/<role> (a version must be taken before the trainer prunes it)."
    )
