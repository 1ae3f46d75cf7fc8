"""The one config tree of realhf: every user-facing fact, declared once with its default.

The root is `AsyncPPOConfig`; Hydra builds the command line from it
(`training/main_async_ppo.py --help` lists every field with the value the run will use), and
`training/configs/async-ppo.yaml` sets the embedded run's values on top of these defaults.
Per-worker configs (`realhf.api.worker_configs`) are derived from this tree by
`realhf.experiments.async_ppo`. A rule on one field's value (a bound, a closed list from
`realhf.api.choices`, a timeout) is declared with the field (`_f(..., ge=0)`, a `Rule` in its
metadata) and checked by one pass over the tree (`realhf.experiments.validation.check_fields`);
rules that tie fields together or hold only under another setting are validation's check_*.

Defaults run on a small CPU machine; docs/benchmarks.md records the measurements behind them.
"""

import os
import time
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from realhf.api import choices
from realhf.base.body_limit import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_REQUEST_BYTES

# The default trial_name, fresh per process (one run of the entry point): a rerun without a
# trial_name never reuses, and so never deletes, an earlier run's files.
FRESH_TRIAL_NAME = time.strftime("run-%Y%m%d-%H%M%S-") + str(os.getpid())


@dataclass(frozen=True)
class Rule:
    """What one field's value must be, declared with the field and checked for every field of the
    tree by one pass before any process starts (realhf.experiments.validation.check_fields):
    `ge`/`gt` a lower bound, `within` a closed range, `choices` a closed list (`empty`: what an
    empty value means, where it may be left empty), `timeout` the seconds of a wait (> 0, or >= 0
    with "zero_off"; at most what Python's waits accept). Rules
    that tie fields together or hold only under another setting stay in validation's check_*
    functions; a rule is never stated in both places (tests/checks/test_field_rules.py)."""

    ge: Optional[float] = None
    gt: Optional[float] = None
    within: Optional[Tuple[float, float]] = None
    choices: Tuple[str, ...] = ()
    empty: str = ""
    timeout: str = ""  # "", "on" or "zero_off"


# The most rows a step may log (stats.log_completions): each is a line on the console per step,
# and its text travels in a reply to the master; beyond a screenful per step nobody reads them.
MAX_LOG_COMPLETIONS = 64


def _f(
    default,
    help: str,
    *,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    within: Optional[Tuple[float, float]] = None,
    choices: Sequence[str] = (),
    empty: str = "",
    timeout: str = "",
    **kw,
):
    """A field with a default, its one-line help and the rule its value must satisfy."""
    metadata: Dict[str, Any] = {"help": help}
    if ge is not None or gt is not None or within is not None or choices or timeout:
        metadata["rule"] = Rule(ge=ge, gt=gt, within=within, choices=tuple(choices), empty=empty, timeout=timeout)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata, **kw)
    return field(default=default, metadata=metadata, **kw)


def _again(base: type, name: str, default: Any = MISSING, help: str = ""):
    """Field `name` of `base` declared again (in a subclass, or in another command's section)
    with its own help and, if given, its own default; its rule, and otherwise its default, stay
    the ones `base` declares (stated once)."""
    known = next(f for f in fields(base) if f.name == name)
    metadata: Dict[str, Any] = {"help": help or known.metadata["help"]}
    if "rule" in known.metadata:
        metadata["rule"] = known.metadata["rule"]
    return field(default=known.default if default is MISSING else default, metadata=metadata)


def _sub(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


# --------------------------------------------------------------------------------------------
# Infrastructure
# --------------------------------------------------------------------------------------------


@dataclass
class NameResolveConfig:
    type: str = _f(
        "redis",
        "Backend of the name-resolve service: 'redis' or 'memory' (one process only).",
        choices=choices.NAME_RESOLVE_BACKENDS,
    )
    redis_url: str = _f(
        "",
        "redis://[:password@]host:port/db of an existing Redis. Empty: the launcher starts a "
        "private redis-server on a free loopback port.",
    )
    keepalive_ttl: float = _f(10.0, "Seconds before a dead worker's heartbeat keys expire.", timeout="on")


@dataclass
class RestartPolicyConfig:
    """Which worker types the launcher restarts when they die mid-run (same index and config)."""

    generation_server: bool = _f(True, "Restart a generation server that dies; it rejoins with the current weights.")
    rollout_worker: bool = _f(True, "Restart a rollout worker that dies; its in-flight prompts are re-admitted.")
    gserver_manager: bool = _f(
        True,
        "Restart the manager that dies; it continues from its admission ledger in Redis, rollout workers wait for it (rollout.manager_wait_timeout).",
    )
    model_worker: bool = _f(False, "Restart a model worker (off: a trainer rank's death ends the run).")
    master_worker: bool = _f(False, "Restart the master (off: its death ends the run).")
    node_worker: bool = _f(
        False, "Restart the node worker (ppo.graph.own_process; off: its death ends the run, as a trainer rank's)."
    )
    evaluator: bool = _f(
        True, "Restart the evaluator (exp_ctrl.eval_freq_steps > 0) that dies; it holds nothing others need."
    )
    max_restarts: int = _f(
        3,
        "Restarts allowed per worker within restart_window seconds; one more death within the window fails the run.",
        ge=0,
    )
    restart_window: float = _f(
        600.0,
        "Seconds over which max_restarts is counted (restarts older than this no longer count); 0: over the whole run.",
        ge=0,
    )
    backoff: float = _f(1.0, "Seconds before restart k+1 of a worker: backoff * 2^k (capped at 30).", ge=0)
    trial_restarts: int = _f(
        2,
        "Whole-trial restarts when a process the run cannot do without dies (a trainer rank, the master, the node worker, or the trial's own Redis) and no per-worker restart covers it: every process is stopped and the trial starts again from its last recovery checkpoint (recover_mode=auto; from the start if there is none). At most this many within trial_restart_window seconds; the same process dying again before a new recovery checkpoint ends the run (a crash loop). 0: such a death ends the run.",
        ge=0,
    )
    trial_restart_window: float = _f(
        3600.0,
        "Seconds over which trial_restarts is counted (older restarts no longer count); 0: over the whole run.",
        ge=0,
    )


@dataclass
class RayResourcesConfig:
    """Custom Ray resources each worker of a type holds: `+cluster.ray.resources.generation_server.node_a=1`
    (Hydra's `+` adds a key) pins the servers to nodes started with resource node_a."""

    generation_server: Dict[str, float] = _f({}, "Custom resources of each generation server.")
    gserver_manager: Dict[str, float] = _f({}, "Custom resources of the manager.")
    model_worker: Dict[str, float] = _f({}, "Custom resources of each trainer rank.")
    rollout_worker: Dict[str, float] = _f({}, "Custom resources of each rollout worker.")
    master_worker: Dict[str, float] = _f({}, "Custom resources of the master.")
    evaluator: Dict[str, float] = _f({}, "Custom resources of the evaluator (exp_ctrl.eval_freq_steps > 0).")


@dataclass
class RayClusterConfig:
    """The Ray cluster of `cluster.launcher=ray` (realhf/scheduler/ray.py)."""

    address: str = _f(
        "",
        "Address of an existing Ray cluster (host:port of its head, or 'auto'); the run joins it and leaves it running. Empty: the launcher starts a Ray cluster on this machine for the run and stops exactly that at the end.",
    )
    num_cpus: int = _f(0, "CPUs of the cluster the launcher starts (no address); 0: this machine's.", ge=0)
    num_gpus: int = _f(0, "GPUs of the cluster the launcher starts (no address).", ge=0)
    resources: RayResourcesConfig = _sub(
        RayResourcesConfig,
        "Custom Ray resources per worker type (CPUs and GPUs come from threads and allocation_mode).",
    )
    placement_strategy: str = _f(
        "PACK",
        "Placement-group strategy for trainer ranks and generation servers: PACK (fill a node, spill to the next: a DP group may span nodes), SPREAD, STRICT_PACK or STRICT_SPREAD.",
        choices=choices.RAY_PLACEMENT_STRATEGIES,
    )
    placement_timeout: float = _f(
        120.0,
        "Seconds to wait for the workers' placement (and the shared-fileroot check) before the run fails naming what could not be placed.",
        timeout="on",
    )


@dataclass
class ClusterSpecConfig:
    launcher: str = _f(
        "local",
        "How workers are started: 'local' (subprocesses of this machine) or 'ray' (Ray actors on the nodes of a Ray cluster; pip install 'realhf[ray]').",
        choices=choices.LAUNCHERS,
    )
    ray: RayClusterConfig = _sub(RayClusterConfig, "The Ray cluster (cluster.launcher=ray).")
    fork_workers: bool = _f(
        True,
        "The local launcher forks its workers from one process (realhf/apps/worker_template.py) that imports each built-in worker type's modules (torch, transformers' model code, the engines) once, before the first worker of the type, instead of starting a fresh interpreter for each: on 2 cores a 2-step run takes ≈ 0.9 s and ≈ 4 CPU-s less, and a restarted worker skips its imports. false: a fresh interpreter per worker.",
    )
    worker_template: str = _f(
        "",
        "Path of the Unix socket of a worker template already running on this machine (python -m realhf.apps.worker_template --listen PATH), shared by every launch that names it: the workers fork from its imports, paid once for all launches (the local launcher with fork_workers; refused otherwise). A launch it cannot serve (another Python, other start-up environment variables, realhf's code changed since it started, not answering) starts its own, saying why. Empty: each launch starts its own.",
    )
    fileroot: str = _f(
        "./runs",
        "Root directory for logs, checkpoints and published weights; on several nodes, one directory every node shares.",
    )
    name_resolve: NameResolveConfig = _sub(NameResolveConfig, "Name-resolve service.")
    restart_policy: RestartPolicyConfig = _sub(RestartPolicyConfig, "Restarting workers that die mid-run.")
    bind_host: str = _f("127.0.0.1", "Address servers and sockets bind to; loopback unless set.")
    stop_grace: float = _f(
        20.0,
        "Seconds after a SIGTERM or SIGINT to the launcher (a scheduler's preemption, Ctrl-C) for the master to finish its step and write a recovery checkpoint, after which every process stops and the launcher exits 75 (resumable: recover_mode=auto continues); a second signal, or this running out, stops at once (exit 130/143). Below Kubernetes' and Slurm's default 30 s between SIGTERM and SIGKILL. 0: stop at once, no checkpoint.",
        ge=0,
    )
    max_request_bytes: int = _f(
        DEFAULT_MAX_REQUEST_BYTES,
        "Largest HTTP request body the generation servers and the manager accept; a larger one is answered 413.",
        ge=1024,
    )
    max_message_bytes: int = _f(
        DEFAULT_MAX_MESSAGE_BYTES,
        "Largest ZMQ message (trajectory group, master/worker request or reply) a socket accepts; libzmq drops a larger one and disconnects its sender.",
        ge=1024,
    )
    n_nodes: int = _f(
        1,
        "Nodes of the cluster (the local launcher runs on one); with GPUs, allocation_mode's processes are placed on n_nodes * n_gpus_per_node GPUs (gpu_placement).",
        ge=1,
    )
    n_gpus_per_node: int = _f(
        0,
        "GPUs per node; 0: the GPUs torch sees on this machine when device is 'cuda' or 'auto', none when it is 'cpu'.",
        ge=0,
    )
    device: str = _f(
        "auto",
        "Where the trainer and the native generation engine compute: 'auto' (a GPU when torch sees one, else the CPU), 'cpu' (the whole run on the CPU, also on a GPU node) or 'cuda'.",
    )
    gpu_placement: str = _f(
        "auto",
        "Which GPUs the generation servers and the trainer ranks get: 'separate' (servers on the first GPUs, the trainer on the next ones, each process with its GPUs alone), 'shared' (both from GPU 0; a GPU holding a server and a trainer rank splits its memory by gen_memory_fraction) or 'auto' (separate when the GPUs suffice, else shared).",
    )
    gen_memory_fraction: float = _f(
        0.5,
        "On a GPU shared by a generation server and a trainer rank (gpu_placement), the server's fraction of its memory (sglang: of that, sglang.mem_fraction_static for weights and KV cache); the trainer rank keeps the rest. In (0, 1).",
    )
    collective_timeout: float = _f(
        60.0,
        "Seconds one collective of the trainer's DP ranks (an FSDP all-gather or reduce-scatter, an all-reduce) may wait for the other ranks before the run fails naming the rank, the engine (actor, ref, critic), the call (forward, train, save) and the step. Raise it only if one layer's forward or backward takes longer than this. Waits on another rank's disk writes are not bounded by it.",
        timeout="on",
    )


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


@dataclass
class GenerationHyperparameters:
    max_new_tokens: int = _f(32, "Maximum number of tokens generated per answer.", gt=0)
    min_new_tokens: int = _f(0, "Minimum number of tokens before EOS may end an answer.")
    temperature: float = _f(1.0, "Sampling temperature; 0 means greedy.")
    top_p: float = _f(1.0, "Nucleus sampling threshold; 1.0 disables it.")
    top_k: int = _f(-1, "Top-k sampling; -1 disables it.")
    stop_token_ids: List[int] = _f([], "Extra token ids that end an answer (EOS always does).")


@dataclass
class NativeEngineConfig:
    """The built-in inference engine (realhf.impl.inference)."""

    n_threads: int = _f(1, "torch threads of the engine process.", ge=1)
    max_running_requests: int = _f(256, "KV-cache slots, i.e. requests decoded together.", ge=1)
    context_length: int = _f(0, "Tokens per slot (prompt + answer); 0: the model's max_position_embeddings.", ge=0)
    dtype: str = _f("float32", "Weights and activations dtype: 'float32' or 'bfloat16'.", choices=choices.DTYPES)
    kind: str = _f(
        "auto",
        "'static_kv' (Qwen2/Llama family, fastest), 'hf' (any HF causal LM, slower) or 'auto'.",
        choices=choices.NATIVE_ENGINE_KINDS,
    )
    seed: int = _f(1, "Seed of the sampler.")
    keep_running_on_update: bool = _f(
        False,
        "On a weight update, keep the running requests and decode on with the new weights (their KV cache was computed with the old ones; each token is tagged with the version that produced it) instead of returning them aborted with their partial output, to be resubmitted.",
    )
    decode_attention: str = _f(
        "auto",
        "Decode attention of the static-KV engine: 'kernel' (a small C loop built on first use with the system C "
        "compiler; float32), 'torch' (batched matmuls) or 'auto' (the kernel when it builds, else torch).",
        choices=choices.DECODE_ATTENTION,
    )


@dataclass
class SGLangConfig:
    """Fields passed to `python -m sglang.launch_server` (GPU clusters only)."""

    mem_fraction_static: float = _f(0.8, "Fraction of GPU memory for weights and KV cache.")
    context_length: int = _f(0, "Maximum context length; 0: the model's own.", ge=0)
    max_running_requests: int = _f(0, "Maximum concurrent requests; 0: SGLang's default.", ge=0)
    chunked_prefill_size: int = _f(-1, "Chunked prefill size; -1: SGLang's default.")
    dtype: str = _f("bfloat16", "Model dtype.")
    kv_cache_dtype: str = _f("auto", "KV cache dtype.")
    attention_backend: str = _f("", "Attention backend; empty: SGLang's default.")
    enable_metrics: bool = _f(True, "Expose Prometheus metrics.")
    disable_radix_cache: bool = _f(False, "Disable the prefix cache.")
    log_level: str = _f("warning", "SGLang's log level.")
    startup_timeout: float = _f(600.0, "Seconds to wait for /health after launch.", timeout="on")
    extra_args: List[str] = _f([], "Extra command-line arguments passed verbatim.")


@dataclass
class VLLMConfig:
    """vLLM as the generation engine (allocation_mode vllm.*): realhf's server around vLLM's engine,
    run from vLLM's own environment (realhf.launch_vllm_server; `bash scripts/setup_env.sh
    vllm` makes it)."""

    python: str = _f(
        "",
        "Interpreter of the environment vLLM is installed in; empty: .venv-vllm/bin/python of the clone (what `bash scripts/setup_env.sh vllm` makes).",
    )
    dtype: str = _f(
        "float32",
        "Weights and activations dtype: 'float32', 'bfloat16' or 'auto' (the checkpoint's).",
        choices=choices.VLLM_DTYPES,
    )
    context_length: int = _f(
        0, "Tokens per request, prompt + answer (vLLM's max_model_len); 0: the model's max_position_embeddings.", ge=0
    )
    max_num_seqs: int = _f(256, "Requests decoded together.", ge=1)
    kv_cache_gib: float = _f(
        0.0,
        "KV cache size in GiB; 0: on a CPU, enough for max_num_seqs requests of context_length tokens (64 MiB to 4 GiB); on a GPU, what gpu_memory_utilization leaves.",
        ge=0,
    )
    gpu_memory_utilization: float = _f(
        0.9, "Fraction of the GPU's memory for weights and KV cache (scaled by the server's share of a shared GPU)."
    )
    enforce_eager: bool = _f(True, "Run the model eagerly (no torch.compile, no CUDA graphs): fast start-up.")
    enable_prefix_caching: bool = _f(
        True, "Share the KV cache of identical prompt prefixes (the n samples of a prompt)."
    )
    cpu_threads_bind: str = _f(
        "auto",
        "vLLM's VLLM_CPU_OMP_THREADS_BIND on a CPU: 'auto' (vLLM binds cores itself; every server the same ones), 'per_server' (server i of n takes the i-th n-th of this machine's cores, at least one), 'nobind', or a core list such as '0-1'.",
    )
    startup_timeout: float = _f(600.0, "Seconds the server may take to load the model and serve /health.", timeout="on")


@dataclass
class GenServerSetupConfig:
    urls: List[str] = _f(
        [],
        "Generation servers that are already running (http://host:port each: SGLang, or the built-in engine started with `python -m realhf.launch_server`): the run launches none, routes to these, updates their weights (weight_sync=distributed: each must reach cluster.bind_host; disk: they must read this run's published_weights/ directory) and leaves them running at the end. allocation_mode's generation part must name as many servers (d = the number of URLs).",
    )
    native: NativeEngineConfig = _sub(NativeEngineConfig, "The built-in engine (allocation_mode native.*).")
    sglang: SGLangConfig = _sub(SGLangConfig, "SGLang server arguments (allocation_mode sglang.*).")
    vllm: VLLMConfig = _sub(VLLMConfig, "vLLM as the engine (allocation_mode vllm.*).")


# --------------------------------------------------------------------------------------------
# Rollout: agents, environments, rollout workers
# --------------------------------------------------------------------------------------------


@dataclass
class AgentConfig:
    """The agent that runs one episode per dataset row (realhf.api.agent), and what the framework does
    with a group of them: reward shaping, dynamic sampling."""

    type: str = _f(
        "math-single-step",
        "Agent: a built-in or registered name ('math-single-step', 'math-multi-turn', 'tool-agent', 'openai-agent'; `--help` lists them) or a user class 'module.path:ClassName' or 'path/to/file.py:ClassName' (relative to the launch directory).",
    )
    reward_scaling: float = _f(
        1.0, "Trained reward = (agent's reward - reward_bias) * reward_scaling (the math agents' rewards are +1/-1)."
    )
    reward_bias: float = _f(0.0, "Subtracted from the agent's reward before scaling.")
    success_rate_lb: float = _f(0.0, "Drop a group whose success rate is strictly below this (dynamic sampling).")
    success_rate_ub: float = _f(1.0, "Drop a group whose success rate is strictly above this (dynamic sampling).")
    num_turns: int = _f(4, "math-multi-turn: attempts per answer (a feedback turn after each wrong one).", gt=0)
    turn_level_discount: float = _f(1.0, "math-multi-turn: reward multiplied by this per extra turn taken.")
    feedback: str = _f("\nWrong. Try again.\nA:", "math-multi-turn: text appended after a wrong answer.")
    reward_fn: str = _f(
        "",
        "math-single-step: 'module:function' or 'path/to/file.py:function' called as reward_fn(prompt, completion, **row) for the reward (a number; True/False mean +1/-1) instead of the environment.",
    )
    reward_timeout: float = _f(
        60.0,
        "math-single-step: seconds a reward_fn call may take; past it the episode fails naming the function and the prompt (counted reward_timed_out), and a call in a process is killed.",
        gt=0,
    )
    reward_isolation: str = _f(
        "process",
        "math-single-step: where a synchronous reward_fn runs: 'process' (reward_processes subprocesses; a call past reward_timeout is killed; the row's fields and the reward cross as JSON) or 'thread' (in the rollout worker; a call past the timeout is abandoned and keeps its thread). An async reward_fn runs on the event loop either way.",
        choices=("process", "thread"),
    )
    reward_processes: int = _f(
        32,
        "math-single-step: at most this many subprocesses per rollout worker call a reward_fn (reward_isolation=process); they start as concurrent calls need them, so calls stuck on some prompts do not hold up the others.",
        gt=0,
    )
    reward_nice: int = _f(
        10,
        "math-single-step: the reward processes' nice level (0-19); a call still running after 1 s drops further, to the idle scheduling class, so one that spins until it is killed takes only CPU the trainer and servers leave free.",
        within=(0, 19),
    )
    args: Dict[str, Any] = _f({}, "Extra keyword arguments for a user agent class.")


@dataclass
class EnvConfig:
    """The environment of each episode (realhf.api.env): one per episode, resources shared per worker."""

    type: str = _f(
        "math",
        "Environment: a built-in or registered name ('math', 'mcp'), a user class 'module.path:ClassName' or 'path/to/file.py:ClassName', or 'none' (agents that need none, e.g. with agent.reward_fn).",
    )
    grader_workers: int = _f(1, "math: processes running math-verify (plain numbers never need one).", gt=0)
    grader_timeout: float = _f(
        5.0, "math: seconds before a math-verify check is killed and graded wrong.", timeout="on"
    )
    check_work: bool = _f(
        False,
        "math: an answer counts only if every worked line 'a+b=c' / 'a-b=c' in it is also right (a right answer reached by wrong steps teaches wrong facts).",
    )
    args: Dict[str, Any] = _f({}, "Extra keyword arguments for a user environment class.")


@dataclass
class RolloutSetupConfig:
    n_workers: int = _f(
        0,
        "Rollout worker processes, each feeding one trainer DP rank (at least one per rank); with two or more per rank a rank goes on being fed while one of its workers restarts. 0: two per DP rank.",
        ge=0,
    )
    agent: AgentConfig = _sub(AgentConfig, "The agent, including the group filter (success_rate_lb/ub).")
    env: EnvConfig = _sub(EnvConfig, "The environment.")
    request_timeout: float = _f(300.0, "Seconds allowed for one /generate call.", timeout="on")
    group_in_one_request: bool = _f(
        True,
        "Ask for a group's answers in one /generate (sampling_params.n = group_size: one HTTP round trip, the prompt prefilled once) when the agent allows it (Agent.one_generation_per_episode, e.g. math-single-step); answers resumed after a weight update go one by one. False: one request per answer.",
    )
    episode_timeout: float = _f(
        600.0,
        "Seconds one episode (agent + environment) may run before it is cancelled, its slot freed and it is logged by qid; 0: no limit.",
        timeout="zero_off",
    )


# --------------------------------------------------------------------------------------------
# Training: models, optimizer, PPO
# --------------------------------------------------------------------------------------------


@dataclass
class OptimizerConfig:
    type: str = _f(
        "adam", "Optimizer; only 'adam' (AdamW with decoupled weight decay) for now.", choices=choices.OPTIMIZERS
    )
    lr: float = _f(1e-4, "Peak learning rate.", gt=0)
    weight_decay: float = _f(0.0, "AdamW weight decay.", ge=0)
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.999, "AdamW beta2.")
    eps: float = _f(1e-8, "AdamW epsilon.", gt=0)
    min_lr_ratio: float = _f(0.0, "Cosine schedule: the final LR as a fraction of the peak.", within=(0.0, 1.0))
    lr_scheduler_type: str = _f(
        "constant", "LR schedule after warm-up: 'constant' or 'cosine'.", choices=choices.LR_SCHEDULES
    )
    warmup_steps_proportion: float = _f(0.0, "Fraction of all optimizer steps spent in linear warm-up.")
    gradient_clipping: float = _f(1.0, "Clip the global gradient norm to this value; 0 disables it.", ge=0)
    max_nonfinite_steps: int = _f(
        3,
        "Optimizer steps in a row that may be skipped for a non-finite loss or gradient norm (the weights stay as they were); one more fails the run.",
        ge=0,
    )


@dataclass
class LoRAConfig:
    """PEFT LoRA adapters on the actor (realhf.impl.model.lora; pip install 'realhf[lora]')."""

    r: int = _f(
        0,
        "LoRA rank: > 0 trains low-rank adapters on target_modules with every base weight frozen (the optimizer holds only the adapters; the frozen base is the reference for ppo.kl_ctl > 0; the generation servers load the merged model); 0: off (every weight trains). Actor only.",
        ge=0,
    )
    alpha: float = _f(16.0, "LoRA alpha: an adapter adds (alpha / r) * B @ A to its module's weight.")
    target_modules: List[str] = _f(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Names (the last part) of the linear modules that get adapters; the default is every projection of a Llama/Qwen2 decoder layer. Checked against the model when it loads.",
    )
    dropout: float = _f(0.0, "Dropout on each adapter's input during training, in [0, 1).")


@dataclass
class ModelTrainEvalConfig:
    path: str = _f("", "HF directory of the model (weights, config.json, tokenizer files).")
    backend: str = _f(
        "torch",
        "Trainer backend; only 'torch' (single device per rank, DP over torch.distributed).",
        choices=choices.TRAINER_BACKENDS,
    )
    dtype: str = _f("float32", "Parameter dtype: 'float32' or 'bfloat16'.", choices=choices.DTYPES)
    n_threads: int = _f(1, "torch threads of the model worker.", ge=1)
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.")
    param_dtype: str = _f(
        "",
        "Mixed precision (FSDP2): the dtype layers compute in; the sharded master weights stay in `dtype`. Empty: float32 on the CPU, bfloat16 on a GPU.",
        choices=choices.DTYPES,
        empty="by device",
    )
    reduce_dtype: str = _f(
        "float32",
        "Mixed precision (FSDP2): the dtype gradients are reduced across DP ranks in.",
        choices=choices.DTYPES,
    )
    optimizer: OptimizerConfig = _sub(OptimizerConfig, "Optimizer and LR schedule (trained models only).")
    lora: LoRAConfig = _sub(LoRAConfig, "LoRA adapters instead of full fine-tuning (actor.lora.r > 0).")


@dataclass
class StepNodeConfig:
    name: str = _f("", "Unique name of the node, as logged.")
    op: str = _f(
        "",
        "What the node runs: a built-in op (proximal_logprobs, logprobs, values, advantages, train_critic, train_actor) or your own function 'module.path:function' or 'path/to/file.py:function', called as fn(ctx, batch, node) -> dict on every trainer rank (realhf.api.step_graph).",
    )
    model: str = _f("", "The engine it runs on: actor, ref or critic; empty: none.")
    inputs: List[str] = _f([], "Tensors it reads: the rollout's (input_ids, rewards, ...) or another node's outputs.")
    outputs: List[str] = _f(
        [], "Tensors it writes (one writer each); 'rewards/<source>' is a reward term the advantages add."
    )
    args: Dict[str, Any] = _f({}, "The op's own arguments.")


@dataclass
class StepGraphConfig:
    drop: List[str] = _f(
        [],
        "Nodes of the default step left out, by name (actor_inf, ref_inf, critic_inf, reward_inf, advantages, critic_train, actor_train); a node that reads what a dropped one wrote is refused at start.",
    )
    reward_model: bool = _f(
        False,
        "Score every sample with the learned reward model at reward.path (training/main_rm.py's output): the node reward_inf writes the reward term rewards/rm, which the advantages add to the rollout's reward (weigh them with reward_weights).",
    )
    reward_model_kind: str = _f(
        "value_head",
        "What reward.path holds (training/main_rm.py's kind; its realhf_reward.json says, and a mismatch is refused at start): 'value_head' scores a sample at its last token; 'implicit' scores it as beta * the sum over the answer's tokens of log pi_rm - log pi_ref (two forwards: the reward model's here, the reference's from ref_inf, which then runs whatever kl_ctl is; the run's reference must be the model the reward model was trained from).",
        choices=choices.REWARD_MODEL_KINDS,
    )
    own_process: List[str] = _f(
        [],
        "Nodes that run on a process of their own (one node worker beside the trainer, its torch threads ref.n_threads) instead of the trainer's ranks, so they overlap the trainer's nodes of the same wave: nodes on the frozen reference (ref_inf) or on no model.",
    )
    reward_weights: Dict[str, float] = _f(
        {},
        "Weights of the reward sources the advantages add: 'rewards' (the rollout's: the environment's or your reward function's) and each node output 'rewards/<source>'; unlisted: 1. E.g. +ppo.graph.reward_weights.rewards=0 on the command line trains on the reward terms alone (a reward model's score).",
    )
    add: List[StepNodeConfig] = _f(
        [],
        "Nodes added to the step, each {name, op, model, inputs, outputs, args}: op a built-in one or your 'module.path:function' / 'path/to/file.py:function', called as fn(ctx, batch, node) -> dict on every trainer rank; an output 'rewards/<source>' is a reward term the advantages add (realhf.api.step_graph). Checked with the rest before any process starts.",
    )


@dataclass
class PPOHyperparameters:
    gen: GenerationHyperparameters = _sub(GenerationHyperparameters, "Sampling parameters of the rollouts.")
    ppo_n_minibatches: int = _f(
        2,
        "Optimizer steps per train step; each takes 1/n of the step's samples, whole groups mixed by length (long and short answers in every minibatch).",
        gt=0,
    )
    micro_batch_tokens: int = _f(
        1024,
        "Padded tokens (rows x longest row) per trainer forward and backward; rows go in order of length so each micro-batch is padded only to its own longest row, and gradients accumulate (the update is the same). 0: a whole minibatch at once.",
        ge=0,
    )
    shared_prompt: bool = _f(
        True,
        "Trainer forwards compute each prompt once for all the rows of its group in a micro-batch (rows then attend to its keys and values); the same logits and gradients as one forward per row, to float rounding. Off, or with gradient_checkpointing (HF keeps no keys and values then): one full forward per row.",
    )
    eps_clip: float = _f(0.2, "PPO clip range: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high].", gt=0)
    eps_clip_high: Optional[float] = _f(None, "Upper clip range (DAPO clip-higher); None: eps_clip.", gt=0)
    c_clip: Optional[float] = _f(
        None, "Dual-clip constant (> 1) bounding the loss of negative advantages; None: off.", gt=1
    )
    policy_loss: str = _f(
        "ppo",
        "Policy loss: 'ppo' (clipped token ratio), 'gspo' (clipped sequence ratio: exp of the mean token log-ratio; use a small eps_clip, e.g. 3e-4), 'cpgd' (clipped log-ratio) or 'gpg' (plain -A*logp, no clip); all keep the decoupled behaviour weight. Your own: 'module.path:function' or 'path/to/file.py:function' (a surrogate, realhf.api.algorithms) or a name registered with @register_policy_loss.",
    )
    loss_agg_mode: str = _f(
        "token-mean",
        "How per-token losses become the minibatch loss: 'token-mean' (every trained token weighs the same), 'seq-mean-token-mean' (mean over sequences of each one's token mean) or 'seq-mean-token-sum' (mean over sequences of each one's token sum).",
        choices=choices.LOSS_AGG_MODES,
    )
    entropy_coef: float = _f(
        0.0, "Entropy bonus: subtract this times the current policy's token entropy from the loss; 0: off.", ge=0
    )
    kl_ctl: float = _f(
        0.0, "KL-to-reference coefficient (the starting one when kl_target > 0); > 0 loads a reference model.", ge=0
    )
    kl_target: float = _f(
        0.0,
        "Adaptive KL: target KL to the reference per token; each step scales the coefficient by 1 + clip(kl/kl_target - 1, -0.2, 0.2) * samples / kl_horizon. 0: fixed kl_ctl.",
        ge=0,
    )
    kl_horizon: float = _f(
        10000.0, "Adaptive KL: samples over which the coefficient may change by about e^0.2 (kl_target > 0)."
    )
    use_decoupled_loss: bool = _f(
        True, "Decoupled PPO loss: clip against recomputed proximal log-probs, weight by pi_prox/pi_behav."
    )
    recompute_logprob: bool = _f(True, "Recompute the log-probs of the current weights before training (actor_inf).")
    prox_logp: str = _f(
        "recompute",
        "Proximal log-probs of the decoupled loss: 'recompute' (the actor_inf forward, exact) or 'loglinear' "
        "(no forward: behav + a*(current - behav) per token, a = lag/(lag+1) for a token lag versions "
        "stale; the first minibatch stays exact, from its own train forward).",
        choices=choices.PROX_LOGP_METHODS,
    )
    behav_imp_weight_cap: Optional[float] = _f(
        None, "Zero the loss of tokens whose pi_prox/pi_behav exceeds this (>= 1); None: no cap.", ge=1
    )
    reward_output_scaling: float = _f(1.0, "Trainer-side reward transform: (reward + bias) * scaling.")
    reward_output_bias: float = _f(0.0, "Trainer-side reward transform: (reward + bias) * scaling.")
    max_reward_clip: Optional[float] = _f(None, "Clip transformed rewards to [-clip, clip]; None: no clip.", gt=0)
    adv_estimator: str = _f(
        "grpo",
        "Advantages: 'grpo' (reward - group mean) / (group std + eps) per prompt group, the same on every token; 'dr_grpo' (reward - group mean); 'batch_norm' (reward - batch mean) / batch std over all samples of the step (all DP ranks); 'gae' GAE over the values of a critic (loads `critic`); 'reinforce' GAE with zero values (the reward-to-go). With a reference (kl_ctl > 0) grpo, dr_grpo and batch_norm add the KL as a loss term, gae and reinforce subtract it from the per-token reward. Your own: 'module.path:function' or 'path/to/file.py:function' (scores, group ids -> one advantage per sample; realhf.api.algorithms) or a name registered with @register_adv_estimator.",
    )
    discount: float = _f(1.0, "GAE discount gamma (adv_estimator gae or reinforce).", within=(0.0, 1.0))
    gae_lambda: float = _f(1.0, "GAE lambda (adv_estimator gae or reinforce).", within=(0.0, 1.0))
    adv_norm: bool = _f(False, "Normalise advantages over all trained tokens of the step (global across DP).")
    value_eps_clip: float = _f(
        0.2,
        "Critic: clipped value loss, the new value may move at most this far from the one critic_inf computed before the step.",
        gt=0,
    )
    critic_warmup_steps: int = _f(
        0,
        "adv_estimator=gae: for the first N train steps only the critic trains (the actor's weights stay, its version still advances).",
        ge=0,
    )
    kl_estimator: str = _f("k3", "KL estimator for kl_ctl > 0: 'k1', 'k2' or 'k3'.", choices=choices.KL_ESTIMATORS)
    graph: StepGraphConfig = _sub(
        StepGraphConfig,
        "The train step as a graph of model calls (realhf.system.trainer.ppo_step declares the default from the settings above); drop or add nodes here.",
    )


@dataclass
class ExperimentSaveEvalControl:
    total_train_epochs: int = _f(
        1, "Stop after this many passes over the dataset (epoch = dataset size / groups_per_step steps).", ge=0
    )
    benchmark_steps: int = _f(0, "> 0: stop after this many train steps instead (wins over total_train_epochs).", ge=0)
    max_train_seconds: float = _f(
        0.0,
        "> 0: also stop (final save, clean end) after the first train step at which the training time since the start of step 1 reaches this many seconds; 0: off.",
        ge=0,
    )
    save_freq_steps: int = _f(0, "Save an HF checkpoint every N steps (and at the end); 0: only at the end.", ge=0)
    save_freq_secs: float = _f(
        0.0,
        "Also save an HF checkpoint after the first train step that ends N or more seconds after the last save (or the start of step 1); 0: off. Saves at a wall-clock cadence whatever a step costs (time-to-accuracy comparisons).",
        ge=0,
    )
    keep_last_saves: int = _f(
        3, "HF saves (checkpoints/<role>/version<v>) kept; older ones are deleted. 0: keep all.", ge=0
    )
    ckpt_freq_steps: int = _f(0, "Save a recovery checkpoint (weights + optimizer + RNG) every N steps; 0: off.", ge=0)
    ckpt_freq_secs: int = _f(0, "Save a recovery checkpoint every N seconds; 0: off.", ge=0)
    eval_freq_steps: int = _f(
        0,
        "Evaluate the published weights (the task's agent and environment on held-out prompts) every N versions (train steps) and the last one, in an evaluator process at low CPU priority; 0: off. Settings: evaluation.during_*.",
        ge=0,
    )


# --------------------------------------------------------------------------------------------
# Data, evaluation, logging
# --------------------------------------------------------------------------------------------


@dataclass
class DatasetColumnsConfig:
    """Which column (JSONL: field) of the user's data holds each fact realhf reads; a row reaches the
    agent and environment with these renamed to the names below, its other columns as they are."""

    query_id: str = _f(
        "query_id",
        "Column of the row's unique id; empty: the data has none, ids are '<file name>-<row>' (the JSONL line or the table row index), stable while the file is unchanged.",
    )
    prompt: str = _f("prompt", "Column of the prompt text.")
    messages: str = _f(
        "messages", "Column of the chat messages ([{role, content}, ...]), used instead of a prompt text."
    )
    solutions: str = _f("solutions", "Column of the reference answers: a list of strings, or one string.")
    task: str = _f("task", "Column of the task name (optional in every row).")


@dataclass
class DatasetConfig:
    path: str = _f(
        "assets/tiny-math/data/train.jsonl",
        "Training prompts: a JSONL file, a .parquet file, a directory written by HF datasets' save_to_disk, a folder of jsonl/json/csv/parquet files (split by file name: train.jsonl, test.jsonl, ...) or a Hugging Face dataset name owner/name read through the HF datasets cache (all but JSONL need the datasets extra; docs/your-data.md). Rows: an id, a prompt text or chat messages, and any columns the agent and environment use (math: solutions); see dataset.columns.",
    )
    test_path: str = _f(
        "assets/tiny-math/data/test.jsonl",
        "Held-out prompts for the before/after accuracy report and the evaluator, in any format dataset.path accepts.",
    )
    columns: DatasetColumnsConfig = _sub(DatasetColumnsConfig, "Column names of dataset.path and dataset.test_path.")
    split: str = _f(
        "train",
        "Split of dataset.path when it has splits: a saved DatasetDict directory, a folder of data files or a hub dataset (ignored for other formats).",
    )
    test_split: str = _f(
        "test", "Split of dataset.test_path when it has splits (as dataset.split; the same source may serve both)."
    )
    config_name: str = _f(
        "",
        "Configuration (subset) of a Hugging Face dataset named in dataset.path / dataset.test_path, e.g. main for openai/gsm8k; empty: its default.",
    )
    chat_template: str = _f(
        "auto",
        "How a row's prompt is encoded: 'auto' (the tokenizer's chat template, generation prompt added, when it has one), 'on' (required) or 'off' (the prompt text as is). Rows with chat 'messages' always use the template.",
        choices=choices.CHAT_TEMPLATE_SETTINGS,
    )


@dataclass
class EvaluationConfig:
    n_prompts: int = _f(
        500,
        "Held-out prompts (dataset.test_path, at most all its rows) the task's agent and environment are evaluated on before and after training: greedy and sampled success rate (accuracy), mean reward; 0: skip.",
        ge=0,
    )
    max_new_tokens: int = _f(32, "Maximum new tokens per answer (each gen() call of an episode) during evaluation.")
    batch_size: int = _f(128, "Prompts per generate call during evaluation.")
    sampled_temperature: float = _f(
        1.0, "Temperature of the 'sampled' evaluation (independent of the rollout temperature, so runs compare)."
    )
    during_n_prompts: int = _f(
        100, "Held-out prompts of each evaluation during training (exp_ctrl.eval_freq_steps > 0)."
    )
    during_samples: int = _f(
        4,
        "k: answers sampled per prompt at sampled_temperature in each evaluation during training; logs their success rate (accuracy), mean reward and pass@k.",
    )
    during_n_threads: int = _f(1, "torch threads of the evaluator process.")
    during_nice: int = _f(
        10,
        "Niceness the evaluator adds to itself (0-19): it takes only the CPU the trainer and the servers leave idle.",
    )


@dataclass
class StatsLoggingConfig:
    tensorboard_path: str = _f("", "Directory for tensorboard event files (needs the tensorboard extra); empty: off.")
    wandb_project: str = _f("", "Weights & Biases project to log every step to (needs the wandb extra); empty: off.")
    wandb_mode: str = _f(
        "offline", "wandb mode: 'offline' (files only, no network) or 'online'.", choices=choices.WANDB_MODES
    )
    progress_bar: bool = _f(
        True,
        "A live progress bar (step/total, ETA, reward, accuracy, samples/s, staleness) in the launcher's terminal; never drawn when stdout is not a terminal.",
    )
    prometheus_port: int = _f(
        0,
        "Port of the master's Prometheus /metrics endpoint of the training metrics (latest step), bound to cluster.bind_host without authentication; 0: off.",
        within=(0, 65535),
    )
    agent_metric_extremes: List[str] = _f(
        [],
        "Names of agent numbers (Outcome.info) whose per-step minimum and maximum are logged too, as agent/<name>_min and agent/<name>_max beside the mean agent/<name>; ['*']: every name.",
    )
    log_completions: int = _f(
        0,
        "Each train step, print N of its samples (prompt, completion, reward, weight version, the agent's numbers) under the step's console line, cut to one line each, and append them whole to completions.jsonl in the trial's log dir; DP rank 0 picks them from its share, one per prompt first (at most 64, and at most its groups x group_size); 0: off.",
        within=(0, MAX_LOG_COMPLETIONS),
    )


# --------------------------------------------------------------------------------------------
# The experiment (training/main_async_ppo.py)
# --------------------------------------------------------------------------------------------


@dataclass
class AsyncPPOConfig:
    """Asynchronous PPO/GRPO on the configured task (the embedded math task by default): the root of
    training/configs/async-ppo.yaml."""

    experiment_name: str = _f("async-ppo", "Name of the experiment; keys, logs and weights live under it.")
    trial_name: str = _f(
        FRESH_TRIAL_NAME,
        "Name of this run of the experiment. Default: a fresh name per run (run-<date>-<time>-<pid>). A name whose files exist is refused unless overwrite=true or recover_mode=auto/resume.",
    )
    overwrite: bool = _f(
        False,
        "Delete the files of an earlier run of the same trial_name and start afresh (recover_mode=disabled only).",
    )
    seed: int = _f(1, "Seed of every worker (each adds its own index where it needs distinct streams).")
    allocation_mode: str = _f(
        "native.d1m1p1+d1m1p1",
        "'<engine>.d<dp>m<tp>p<pp>+d<dp>m<tp>p<pp>': generation servers, then the trainer (engine native, sglang or vllm).",
    )
    cluster: ClusterSpecConfig = _sub(ClusterSpecConfig, "Where files go, how processes find each other.")
    actor: ModelTrainEvalConfig = _sub(
        ModelTrainEvalConfig, "The trained policy; its path is also the generation servers' initial weights."
    )
    ref: ModelTrainEvalConfig = _sub(
        ModelTrainEvalConfig,
        "Reference policy for the KL term (used only when ppo.kl_ctl > 0; empty path: actor.path).",
    )
    critic: ModelTrainEvalConfig = _sub(
        ModelTrainEvalConfig,
        "Critic for ppo.adv_estimator=gae: a value head on the actor's architecture, initialised from this path (empty: actor.path; the head itself starts random).",
    )
    reward: ModelTrainEvalConfig = _sub(
        ModelTrainEvalConfig,
        "A learned reward model (training/main_rm.py's output) for a reward_model node of the step (ppo.graph.add): frozen, a value head scoring each sample at its last token.",
    )
    dataset: DatasetConfig = _sub(DatasetConfig, "Training and held-out prompts.")
    groups_per_step: int = _f(16, "B: prompt groups per train step, summed over DP ranks (the admission unit).", gt=0)
    group_size: int = _f(8, "Answers sampled per prompt (one prompt group).", gt=0)
    ppo: PPOHyperparameters = _sub(PPOHyperparameters, "PPO/GRPO and sampling hyper-parameters.")
    max_head_offpolicyness: int = _f(
        2, "η: a trained token is at most this many versions behind the trainer; 0 = synchronous PPO.", ge=0
    )
    max_concurrent_rollouts: int = _f(32, "Prompt groups in flight at once over all rollout workers.", gt=0)
    new_tokens_per_chunk: int = _f(
        0, "Resubmit a generation request after this many new tokens (0: no chunking).", ge=0
    )
    schedule_policy: str = _f(
        "round_robin",
        "Server choice: 'round_robin', 'least_requests' or 'least_token_usage'.",
        choices=choices.SCHEDULE_POLICIES,
    )
    weight_sync: str = _f(
        "distributed",
        "How new weights reach the generation servers: 'distributed' (the trainer broadcasts each version to every routed server at once over a process group, SGLang's /update_weights_from_distributed: gloo on the CPU or where a server shares the trainer's GPU, NCCL between separate GPUs; a version is also written to disk when an evaluation or the end of the run needs it, or when its broadcast failed) or 'disk' (each version written as an HF directory, which the servers reload one at a time).",
        choices=choices.WEIGHT_SYNC,
    )
    weight_sync_bucket_mb: int = _f(
        256, "weight_sync=distributed: the most MiB of weights gathered from the shards and sent in one bucket.", gt=0
    )
    exp_ctrl: ExperimentSaveEvalControl = _sub(ExperimentSaveEvalControl, "When to stop, save and checkpoint.")
    recover_mode: str = _f(
        "disabled",
        "'disabled': start afresh (a trial_name with files is refused unless overwrite=true); 'auto': resume from the trial's last recovery checkpoint if there is one; 'resume': resume, and fail if there is none.",
        choices=choices.RECOVER_MODES,
    )
    stall_timeout: float = _f(
        120.0, "After N seconds without a completed train step the master logs who waits for what.", timeout="on"
    )
    rollout: RolloutSetupConfig = _sub(RolloutSetupConfig, "Rollout workers, agent and environment.")
    gen_server: GenServerSetupConfig = _sub(GenServerSetupConfig, "Generation server engines.")
    user_paths: List[str] = _f(
        [],
        "Directories your own code (agents, environments, reward functions, losses named 'module.path:Name') is imported from, besides the launch directory (always first); relative ones are from the launch directory. Each must exist; every worker puts them on its import path.",
    )
    evaluation: EvaluationConfig = _sub(
        EvaluationConfig,
        "Accuracy report before and after training, and evaluations during it (exp_ctrl.eval_freq_steps).",
    )
    stats: StatsLoggingConfig = _sub(
        StatsLoggingConfig, "Where per-step metrics go besides the console and metrics.jsonl."
    )


# --------------------------------------------------------------------------------------------
# Supervised warm start (training/main_sft.py): a separate root
# --------------------------------------------------------------------------------------------


@dataclass
class SFTDatasetConfig:
    """How training/main_sft.py reads train_path and test_path: the RL run's `dataset` keys, with
    the same meaning, so one dataset is described once for both."""

    columns: DatasetColumnsConfig = _sub(DatasetColumnsConfig, "Column names of train_path and test_path.")
    split: str = _f(
        "train", "Split of train_path when it is a saved DatasetDict directory (ignored for other formats)."
    )
    test_split: str = _f(
        "test", "Split of test_path when it is a saved DatasetDict directory (ignored for other formats)."
    )
    chat_template: str = _f(
        "auto",
        "How a row's prompt is encoded, as the RL run's dataset.chat_template: 'auto' (the tokenizer's chat template, generation prompt added, when it has one), 'on' (required) or 'off' (the prompt text as is). Rows with chat 'messages' always use the template.",
        choices=choices.CHAT_TEMPLATE_SETTINGS,
    )


@dataclass
class EngineRunConfig:
    """What training/main_sft.py and training/main_rm.py share: a model trained on the RL
    trainer's engine (FSDP2 over `dp` rank processes, LoRA) for a fixed number of steps."""

    model_path: str = _f("", "HF directory of the model to train.")
    output_path: str = _f("", "Where the trained HF directory is written (with LoRA: the merged model).")
    train_path: str = _f(
        "", "Training rows: a JSONL file, a .parquet file or a directory written by HF datasets' save_to_disk."
    )
    test_path: str = _f("", "Held-out rows for the report, in any format train_path accepts.")
    seed: int = _f(1, "Seed for data order and initialisation.")
    steps: int = _f(200, "Optimizer steps (a fixed count).", ge=1)
    batch_size: int = _f(32, "Training examples per optimizer step (over all DP ranks together).", ge=1)
    lr: float = _f(3e-3, "Peak AdamW learning rate.", gt=0)
    warmup_steps: int = _f(20, "Steps of linear warm-up before the cosine decay to zero.", ge=0)
    weight_decay: float = _f(0.1, "AdamW weight decay.", ge=0)
    grad_clip: float = _f(1.0, "Gradient-norm clip; 0 disables it.", ge=0)
    max_train_rows: int = _f(0, "Use only the first N training rows; 0: all.")
    log_interval: int = _f(10, "Log the training loss every N steps.")
    n_threads: int = _f(1, "torch threads (of each DP rank).", ge=1)
    dp: int = _f(
        1,
        "Data-parallel ranks: this command starts as many processes (over gloo on CPUs, NCCL on GPUs: one GPU each) and ends them all if one fails or on Ctrl-C. Every batch is split between them by tokens and the model is FSDP2-sharded over them; each step is DP=1's step on the whole batch, to float rounding.",
        ge=1,
    )
    device: str = _f(
        "auto", "'auto' (a GPU per rank when torch sees one, else the CPU), 'cpu' or 'cuda', as cluster.device."
    )
    dtype: str = _f("float32", "Parameter dtype: 'float32' or 'bfloat16'.", choices=choices.DTYPES)
    param_dtype: str = _f(
        "",
        "Mixed precision (FSDP2): the dtype layers compute in; the master weights stay in `dtype`. Empty: float32 on the CPU, bfloat16 on a GPU.",
        choices=choices.DTYPES,
        empty="by device",
    )
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.")
    collective_timeout: float = _f(
        60.0,
        "Seconds one collective of the DP ranks may wait for the others before the run fails naming the rank, the call and the step (as cluster.collective_timeout).",
        timeout="on",
    )
    distributed_timeout: float = _f(
        300.0, "Seconds the DP ranks wait to meet at the start, and for rank 0's write of output_path.", timeout="on"
    )
    lora: LoRAConfig = _sub(
        LoRAConfig,
        "LoRA adapters instead of full fine-tuning (lora.r > 0): the base stays frozen, only the adapters train; output_path holds the merged weights, a plain HF directory.",
    )
    dataset: SFTDatasetConfig = _sub(SFTDatasetConfig, "Column names, splits and chat template of the data.")


@dataclass
class SFTConfig(EngineRunConfig):
    output_path: str = _f(
        "",
        "Where the fine-tuned HF directory is written (with LoRA: the merged model); an RL run starts from it with actor.path=<this>.",
    )
    train_path: str = _f(
        "",
        "Training rows: a JSONL file, a .parquet file or a directory written by HF datasets' save_to_disk, read as the RL run reads dataset.path. A row trains on its 'sft_trace' (assistant and tool turns), else on the assistant turns of its chat 'messages', else on its prompt followed by solutions[0]; only those tokens (and each turn's EOS) carry the loss.",
    )
    test_path: str = _f(
        "", "Held-out prompts with solutions for the accuracy report, in any format train_path accepts."
    )
    steps: int = _again(
        EngineRunConfig,
        "steps",
        200,
        "Optimizer steps (a fixed count: the tiny task's accuracy jumps past a few hundred).",
    )
    micro_batch_tokens: int = _again(
        PPOHyperparameters,
        "micro_batch_tokens",
        help="Padded tokens (rows x longest row) per forward and backward of a rank; gradients accumulate, so the update is the same. 0: a rank's whole share of the batch at once. The RL trainer's default (ppo.micro_batch_tokens).",
    )
    eval_n: int = _f(0, "Test prompts for the accuracy report; 0: all, -1: skip evaluation.")
    eval_batch_size: int = _f(64, "Prompts per generate call during evaluation.")
    max_new_tokens: int = _f(32, "Maximum new tokens per answer (each gen() call of an episode) during evaluation.")


@dataclass
class RMConfig(EngineRunConfig):
    """training/main_rm.py: a reward model, a value head on the model's architecture scoring a
    prompt and its answer at the answer's last token (or, kind=implicit, the causal LM's
    log-ratio to its starting point), trained with the Bradley–Terry loss. No
    micro_batch_tokens: a pair's two answers always go through one forward (the loss compares
    their scores), a rank's share of the pairs at once (lower batch_size or raise dp)."""

    output_path: str = _f(
        "",
        "Where the reward model is written: an HF directory (AutoModelForTokenClassification, one label: the score is the output at the answer's last token), which an RL run names as reward.path.",
    )
    train_path: str = _f(
        "",
        "Preference pairs: a JSONL file, a .parquet file or a save_to_disk directory whose rows have a prompt (or chat messages), 'chosen' and 'rejected' (the preferred and the other answer's text).",
    )
    test_path: str = _f("", "Held-out pairs for the report (how often the chosen answer scores higher).")
    steps: int = _again(EngineRunConfig, "steps", 300, "Optimizer steps.")
    batch_size: int = _again(
        EngineRunConfig, "batch_size", 32, "Preference pairs per optimizer step (over all DP ranks together)."
    )
    lr: float = _again(EngineRunConfig, "lr", 1e-3, "Peak AdamW learning rate.")
    eval_n: int = _f(0, "Test pairs for the report; 0: all, -1: skip it.")
    kind: str = _f(
        "value_head",
        "'value_head': a value head on model_path's architecture, the score its output at the answer's last token (AutoModelForTokenClassification); 'implicit': model_path's causal LM itself, the score beta * the sum over the answer's tokens of log pi - log pi_model_path (a frozen copy), which checks each token with the model's own next-token knowledge (AutoModelForCausalLM; an RL run takes it with ppo.graph.reward_model_kind=implicit).",
        choices=choices.REWARD_MODEL_KINDS,
    )
    beta: float = _f(0.1, "kind=implicit: the score's scale (beta of the log-ratio; DPO's beta).", gt=0)
    nll_weight: float = _f(
        0.0,
        "kind=implicit: weight of the chosen answers' per-token negative log-likelihood added to the loss (DPO + NLL): keeps the chosen answers likely, so the log-ratio does not score most answers below 0 (which an RL run exploits by stopping early).",
        ge=0,
    )


# The name before the experiment became task-neutral; user code importing it keeps working.
AsyncPPOMATHConfig = AsyncPPOConfig
