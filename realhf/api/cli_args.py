"""The one config tree of realhf.

Every knob a user can turn is a dataclass field here with a one-line `help`; Hydra builds the
command line from these classes (`training/main_async_ppo.py --help`), and the YAML defaults in
`training/configs/` are checked against them by the tests. Defaults run on a 2-core laptop.

Hydra/OmegaConf cannot express `Literal`, so choice fields are plain `str` validated by
`realhf.api.validation` before any process starts.
"""

from dataclasses import dataclass, field
from typing import List, Optional


def _f(default, help: str, **kw):
    """A field with a default and its one-line help."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def _sub(cls, help: str):
    return field(default_factory=cls, metadata={"help": help})


# --------------------------------------------------------------------------------------------
# Infrastructure
# --------------------------------------------------------------------------------------------


@dataclass
class NameResolveConfig:
    type: str = _f("redis", "Backend of the name-resolve service: 'redis' or 'memory' (one process only).")
    redis_url: str = _f(
        "",
        "redis://[:password@]host:port/db of an existing Redis. Empty: the launcher starts a "
        "private redis-server on a free loopback port.",
    )
    keepalive_ttl: float = _f(10.0, "Seconds before a dead worker's heartbeat keys expire.")


@dataclass
class RestartPolicyConfig:
    """Which worker types the launcher restarts when they die mid-run (same index and config)."""

    generation_server: bool = _f(True, "Restart a generation server that dies; it rejoins with the current weights.")
    rollout_worker: bool = _f(True, "Restart a rollout worker that dies; its in-flight prompts are re-admitted.")
    gserver_manager: bool = _f(False, "Restart the manager (off: its admission counters live in memory).")
    model_worker: bool = _f(False, "Restart a model worker (off: a trainer rank's death ends the run).")
    master_worker: bool = _f(False, "Restart the master (off: its death ends the run).")
    max_restarts: int = _f(3, "Restarts allowed per worker; the next death fails the run.")
    backoff: float = _f(1.0, "Seconds before restart k+1 of a worker: backoff * 2^k (capped at 30).")

    def __post_init__(self):
        if self.max_restarts < 0:
            raise ValueError(f"cluster.restart_policy.max_restarts must be >= 0, got {self.max_restarts}")
        if self.backoff < 0:
            raise ValueError(f"cluster.restart_policy.backoff must be >= 0, got {self.backoff}")


@dataclass
class ClusterSpecConfig:
    fileroot: str = _f("./runs", "Root directory for logs, checkpoints and published weights.")
    name_resolve: NameResolveConfig = _sub(NameResolveConfig, "Name-resolve service.")
    restart_policy: RestartPolicyConfig = _sub(RestartPolicyConfig, "Restarting workers that die mid-run.")
    bind_host: str = _f("127.0.0.1", "Address servers and sockets bind to; loopback unless set.")
    n_nodes: int = _f(1, "Number of nodes.")
    n_gpus_per_node: int = _f(0, "GPUs per node; 0 on a CPU machine.")


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


@dataclass
class GenerationHyperparameters:
    max_new_tokens: int = _f(32, "Maximum number of tokens generated per answer.")
    min_new_tokens: int = _f(0, "Minimum number of tokens before EOS may end an answer.")
    temperature: float = _f(1.0, "Sampling temperature; 0 means greedy.")
    top_p: float = _f(1.0, "Nucleus sampling threshold; 1.0 disables it.")
    top_k: int = _f(-1, "Top-k sampling; -1 disables it.")
    stop_token_ids: List[int] = _f([], "Extra token ids that end an answer (EOS always does).")


@dataclass
class NativeEngineConfig:
    """The built-in CPU inference engine (realhf.impl.inference)."""

    n_threads: int = _f(1, "torch threads for the engine process (1 is fastest on a shared 2-core box).")
    max_running_requests: int = _f(256, "KV-cache slots, i.e. requests decoded together.")
    context_length: int = _f(0, "Tokens per slot (prompt + answer); 0: the model's max_position_embeddings.")
    dtype: str = _f("float32", "Weights and activations dtype: 'float32' or 'bfloat16'.")
    kind: str = _f(
        "auto",
        "'static_kv' (Qwen2/Llama family, fastest), 'hf' (any HF causal LM, slower) or 'auto'.",
    )
    seed: int = _f(1, "Seed of the sampler.")
    decode_attention: str = _f(
        "auto",
        "Decode attention of the static-KV engine: 'kernel' (a small C loop built on first use with the system C "
        "compiler; float32), 'torch' (batched matmuls) or 'auto' (the kernel when it builds, else torch).",
    )


@dataclass
class SGLangConfig:
    """Fields passed to `python -m sglang.launch_server` (GPU clusters only)."""

    mem_fraction_static: float = _f(0.8, "Fraction of GPU memory for weights and KV cache.")
    context_length: int = _f(0, "Maximum context length; 0: the model's own.")
    max_running_requests: int = _f(0, "Maximum concurrent requests; 0: SGLang's default.")
    chunked_prefill_size: int = _f(-1, "Chunked prefill size; -1: SGLang's default.")
    dtype: str = _f("bfloat16", "Model dtype.")
    kv_cache_dtype: str = _f("auto", "KV cache dtype.")
    attention_backend: str = _f("", "Attention backend; empty: SGLang's default.")
    enable_metrics: bool = _f(True, "Expose Prometheus metrics.")
    disable_radix_cache: bool = _f(False, "Disable the prefix cache.")
    log_level: str = _f("warning", "SGLang's log level.")
    startup_timeout: float = _f(600.0, "Seconds to wait for /health after launch.")
    extra_args: List[str] = _f([], "Extra command-line arguments passed verbatim.")


# --------------------------------------------------------------------------------------------
# Supervised warm start (training/main_sft.py)
# --------------------------------------------------------------------------------------------


@dataclass
class SFTConfig:
    model_path: str = _f("", "HF directory of the model to fine-tune.")
    output_path: str = _f("", "Where the fine-tuned HF directory is written.")
    train_path: str = _f("", "JSONL training prompts with solutions.")
    test_path: str = _f("", "JSONL held-out prompts for the accuracy report.")
    seed: int = _f(1, "Seed for data order and initialisation.")
    steps: int = _f(200, "Optimizer steps; a fixed count (the tiny task jumps to ~90% past ~240 steps).")
    batch_size: int = _f(32, "Training examples per optimizer step.")
    lr: float = _f(3e-3, "Peak AdamW learning rate.")
    warmup_steps: int = _f(20, "Steps of linear warm-up before the cosine decay to zero.")
    weight_decay: float = _f(0.1, "AdamW weight decay (0.1 measured steadier than 0 on the tiny task).")
    grad_clip: float = _f(1.0, "Gradient-norm clip; 0 disables it.")
    max_train_rows: int = _f(0, "Use only the first N training rows; 0: all.")
    log_interval: int = _f(10, "Log the training loss every N steps.")
    eval_n: int = _f(0, "Test prompts for the accuracy report; 0: all, -1: skip evaluation.")
    eval_batch_size: int = _f(64, "Prompts per generate call during evaluation.")
    max_new_tokens: int = _f(32, "Maximum new tokens per answer during evaluation.")
    n_threads: int = _f(1, "torch threads (1 is fastest on a shared 2-core machine).")


# --------------------------------------------------------------------------------------------
# Generation servers (realhf.system.generation_server)
# --------------------------------------------------------------------------------------------
# @@section generation-server
GENERATION_BACKENDS = ("native", "sglang")
NATIVE_ENGINE_KINDS = ("auto", "static_kv", "hf")


@dataclass
class GenerationServerConfig:
    """One generation server (worker type `generation_server`), SGLang protocol (DESIGN §5)."""

    backend: str = _f("native", "'native' (built-in CPU engine) or 'sglang' (python -m sglang.launch_server, GPUs).")
    model_path: str = _f("", "HF directory (config.json + safetensors) of the initial weights.")
    host: str = _f("127.0.0.1", "Address the HTTP server binds to.")
    port: int = _f(0, "HTTP port; 0: a free port.")
    native: NativeEngineConfig = _sub(NativeEngineConfig, "The built-in engine (backend=native).")
    sglang: SGLangConfig = _sub(SGLangConfig, "SGLang server arguments (backend=sglang).")
    tp_size: int = _f(1, "Tensor parallelism of the sglang backend (native: must be 1).")
    base_gpu_id: int = _f(0, "First GPU of the sglang backend.")
    seed: int = _f(1, "Sampler seed; server i uses seed + i (overrides native.seed).")
    weight_version: int = _f(0, "Weight version reported until the first update_weights_from_disk.")
    startup_timeout: float = _f(120.0, "Seconds the native backend may take to serve /health (sglang: sglang.startup_timeout).")
    health_check_interval: float = _f(2.0, "Seconds between liveness checks of the backend; a dead backend fails the worker.")
    health_timeout: float = _f(10.0, "Seconds one /health request of the sglang backend may take.")
    keepalive_ttl: float = _f(10.0, "Seconds before this server's gen_servers/ entry expires if the process dies.")
    weights_root: str = _f("", "<fileroot>/param_realloc/<role>: on start, serve the version named by model_version/<role> from here (a restarted server rejoins current); empty: model_path.")
    model_role: str = _f("actor", "Role whose model_version a (re)starting server loads from weights_root.")


def validate_generation_server_config(cfg: "GenerationServerConfig") -> None:
    """Errors naming the field, before any process or model is started."""
    if cfg.backend not in GENERATION_BACKENDS:
        raise ValueError(f"generation server: backend must be one of {GENERATION_BACKENDS}, got {cfg.backend!r}")
    if not cfg.model_path:
        raise ValueError("generation server: model_path is empty; set it to an HF model directory")
    if cfg.native.kind not in NATIVE_ENGINE_KINDS:
        raise ValueError(f"generation server: native.kind must be one of {NATIVE_ENGINE_KINDS}, got {cfg.native.kind!r}")
    if cfg.native.dtype not in ("float32", "bfloat16"):
        raise ValueError(f"generation server: native.dtype must be 'float32' or 'bfloat16', got {cfg.native.dtype!r}")
    if cfg.native.decode_attention not in ("auto", "kernel", "torch"):
        raise ValueError(f"generation server: native.decode_attention must be 'auto', 'kernel' or 'torch', "
                         f"got {cfg.native.decode_attention!r}")
    if cfg.native.n_threads < 1:
        raise ValueError(f"generation server: native.n_threads must be >= 1, got {cfg.native.n_threads}")
    if cfg.native.max_running_requests < 1:
        raise ValueError(f"generation server: native.max_running_requests must be >= 1, got {cfg.native.max_running_requests}")
    if cfg.backend == "native" and cfg.tp_size != 1:
        raise ValueError(f"generation server: tp_size must be 1 with backend=native, got {cfg.tp_size}")
    if not 0 <= cfg.port < 65536:
        raise ValueError(f"generation server: port must be in [0, 65535], got {cfg.port}")
    for name in ("startup_timeout", "health_check_interval", "health_timeout", "keepalive_ttl"):
        if getattr(cfg, name) <= 0:
            raise ValueError(f"generation server: {name} must be > 0, got {getattr(cfg, name)}")



# --------------------------------------------------------------------------------------------
# Rollout side: agents, environments, GserverManager, RolloutWorker
# --------------------------------------------------------------------------------------------
# @@section rollout

from typing import Any, Dict  # noqa: E402  (this section's own imports)

SCHEDULE_POLICIES = ("round_robin", "least_requests", "least_token_usage")


def _check_choice(value: str, choices, field_name: str) -> None:
    if value not in choices:
        raise ValueError(f"{field_name}={value!r} is not valid; choose one of {list(choices)}")


def _check_positive(value, field_name: str, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{field_name} must be {'>= 0' if allow_zero else '> 0'}, got {value}")


@dataclass
class AgentConfig:
    """The agent that turns one prompt into one trajectory (realhf.api.agent)."""

    type: str = _f(
        "math-single-step",
        "Agent: 'math-single-step', 'math-multi-turn' or a user class 'module.path:ClassName'.",
    )
    reward_scaling: float = _f(1.0, "Reward = ((success - 0.5)*2 - reward_bias) * reward_scaling.")
    reward_bias: float = _f(0.0, "Subtracted from the ±1 success reward before scaling.")
    success_rate_lb: float = _f(0.0, "Drop a group whose success rate is strictly below this (dynamic sampling).")
    success_rate_ub: float = _f(1.0, "Drop a group whose success rate is strictly above this (dynamic sampling).")
    num_turns: int = _f(4, "math-multi-turn: attempts per answer (a feedback turn after each wrong one).")
    turn_level_discount: float = _f(1.0, "math-multi-turn: reward multiplied by this per extra turn taken.")
    feedback: str = _f("\nWrong. Try again.\nA:", "math-multi-turn: text appended after a wrong answer.")
    args: Dict[str, Any] = _f({}, "Extra keyword arguments for a user agent class.")

    def __post_init__(self):
        if not 0.0 <= self.success_rate_lb <= 1.0 or not 0.0 <= self.success_rate_ub <= 1.0:
            raise ValueError(
                f"agent.success_rate_lb={self.success_rate_lb} and agent.success_rate_ub="
                f"{self.success_rate_ub} must lie in [0, 1]"
            )
        if self.success_rate_lb > self.success_rate_ub:
            raise ValueError(
                f"agent.success_rate_lb={self.success_rate_lb} > agent.success_rate_ub={self.success_rate_ub}: "
                "every group would be dropped"
            )
        _check_positive(self.num_turns, "agent.num_turns")


@dataclass
class EnvConfig:
    """The environment that grades an agent's actions (realhf.api.env)."""

    type: str = _f("math", "Environment: 'math' or a user class 'module.path:ClassName'.")
    grader_workers: int = _f(1, "math: processes running math-verify (plain numbers never need one).")
    grader_timeout: float = _f(5.0, "math: seconds before a math-verify check is killed and graded wrong.")
    check_work: bool = _f(False, "math: an answer counts only if every worked line 'a+b=c' / 'a-b=c' in it is also right (a right answer reached by wrong steps teaches wrong facts).")
    args: Dict[str, Any] = _f({}, "Extra keyword arguments for a user environment class.")

    def __post_init__(self):
        _check_positive(self.grader_workers, "env.grader_workers")
        _check_positive(self.grader_timeout, "env.grader_timeout")


@dataclass
class GserverManagerConfig:
    """The GserverManager: admission under the staleness rule, routing, weight updates."""

    host: str = _f("127.0.0.1", "Address the manager's HTTP server binds to (port: any free one).")
    schedule_policy: str = _f(
        "round_robin", "Server choice for a new group: 'round_robin', 'least_requests' or 'least_token_usage'."
    )
    max_concurrent_rollouts: int = _f(64, "Prompt groups in flight at once, over all rollout workers.")
    train_batch_size: int = _f(4, "B: prompt groups per train step (the admission unit).")
    max_head_offpolicyness: int = _f(0, "η: versions a trained token may lag the trainer (0: synchronous PPO).")
    n_servers: int = _f(1, "Generation servers to wait for under gen_servers/ before serving.")
    model_role: str = _f("actor", "Role whose model_version the manager watches and loads.")
    fileroot: str = _f("./runs", "Published weights are read from <fileroot>/param_realloc/<role>/<version>.")
    poll_interval: float = _f(0.25, "Seconds between reads of model_version and stale_dropped (<= 0.5).")
    discovery_timeout: float = _f(300.0, "Seconds to wait for n_servers generation servers to register.")
    update_timeout: float = _f(300.0, "Seconds allowed for one server's pause/update/continue.")
    log_interval: float = _f(10.0, "Seconds between status log lines.")
    health_check_interval: float = _f(1.0, "Seconds between GET /health of every registered generation server.")
    health_timeout: float = _f(5.0, "Seconds one /health may take before it counts as a failure.")
    max_health_failures: int = _f(2, "Consecutive failed health checks that drop a server from routing (until it answers again).")
    trained_groups_at_start: int = _f(0, "Groups already trained when the run resumes from a checkpoint; admission counts them as accepted.")

    def __post_init__(self):
        _check_choice(self.schedule_policy, SCHEDULE_POLICIES, "gserver_manager.schedule_policy")
        _check_positive(self.max_concurrent_rollouts, "gserver_manager.max_concurrent_rollouts")
        _check_positive(self.train_batch_size, "gserver_manager.train_batch_size")
        _check_positive(self.max_head_offpolicyness, "gserver_manager.max_head_offpolicyness", allow_zero=True)
        _check_positive(self.n_servers, "gserver_manager.n_servers")
        if not 0 < self.poll_interval <= 0.5:
            raise ValueError(f"gserver_manager.poll_interval must be in (0, 0.5] s, got {self.poll_interval}")


@dataclass
class RolloutWorkerConfig:
    """One rollout worker: many concurrent agent episodes over its shard of the prompts."""

    dataset_path: str = _f("", "JSONL prompts (query_id, prompt, solutions, task); each worker takes a disjoint shard.")
    tokenizer_path: str = _f("", "HF directory of the tokenizer (usually the actor's model path).")
    seed: int = _f(1, "Seed of the prompt order (each worker adds its index).")
    agent: AgentConfig = _sub(AgentConfig, "The agent.")
    env: EnvConfig = _sub(EnvConfig, "The environment.")
    gconfig: GenerationHyperparameters = _sub(GenerationHyperparameters, "Sampling parameters.")
    group_size: int = _f(8, "Answers sampled per prompt (one prompt group).")
    max_concurrent_rollouts: int = _f(16, "Prompt groups this worker keeps in flight.")
    new_tokens_per_chunk: int = _f(0, "Resubmit a request after this many new tokens (0: no chunking).")
    n_pullers: int = _f(1, "Trainer DP heads receiving trajectories (pushers are grouped over them).")
    request_timeout: float = _f(300.0, "Seconds allowed for one /generate call.")
    sampler_state: str = _f("", "JSON PromptSampler state to resume the prompt order from (set on recovery); empty: the start.")
    manager_timeout: float = _f(30.0, "Seconds allowed for one call to the GserverManager.")
    discovery_timeout: float = _f(300.0, "Seconds to wait for the manager and the trajectory puller.")
    push_timeout: float = _f(300.0, "Seconds a push may block on a full trainer queue.")
    max_consecutive_failures: int = _f(20, "Episodes failing in a row before the worker gives up.")
    server_wait_timeout: float = _f(300.0, "Seconds a request keeps retrying while its generation server is down (killed, restarting) before the episode fails.")
    log_every_groups: int = _f(20, "Log one line per this many finished groups.")

    def __post_init__(self):
        _check_positive(self.group_size, "rollout.group_size")
        _check_positive(self.max_concurrent_rollouts, "rollout.max_concurrent_rollouts")
        _check_positive(self.new_tokens_per_chunk, "rollout.new_tokens_per_chunk", allow_zero=True)
        _check_positive(self.n_pullers, "rollout.n_pullers")
        _check_positive(self.max_consecutive_failures, "rollout.max_consecutive_failures")


# --------------------------------------------------------------------------------------------
# Training side: PPO, optimizer, ModelWorker, MasterWorker, experiment control
# --------------------------------------------------------------------------------------------
# @@section training


@dataclass
class OptimizerConfig:
    type: str = _f("adam", "Optimizer; only 'adam' (AdamW with decoupled weight decay) for now.")
    lr: float = _f(1e-4, "Peak learning rate (1e-4 learns on the tiny task; 3e-4 was unstable there).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    beta1: float = _f(0.9, "AdamW beta1.")
    beta2: float = _f(0.999, "AdamW beta2.")
    eps: float = _f(1e-8, "AdamW epsilon.")
    min_lr_ratio: float = _f(0.0, "Cosine schedule: the final LR as a fraction of the peak.")
    lr_scheduler_type: str = _f("constant", "LR schedule after warm-up: 'constant' or 'cosine'.")
    warmup_steps_proportion: float = _f(0.0, "Fraction of all optimizer steps spent in linear warm-up.")
    gradient_clipping: float = _f(1.0, "Clip the global gradient norm to this value; 0 disables it.")


@dataclass
class ModelTrainEvalConfig:
    path: str = _f("", "HF directory of the model (weights, config.json, tokenizer files).")
    backend: str = _f("torch", "Trainer backend; only 'torch' (single device per rank, DP over torch.distributed).")
    dtype: str = _f("float32", "Parameter dtype: 'float32' or 'bfloat16'.")
    n_threads: int = _f(1, "torch threads of the model worker (1 is fastest on a shared 2-core box).")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass to save memory.")
    optimizer: OptimizerConfig = _sub(OptimizerConfig, "Optimizer and LR schedule (trained models only).")


@dataclass
class PPOHyperparameters:
    gen: GenerationHyperparameters = _sub(GenerationHyperparameters, "Sampling parameters of the rollouts.")
    ppo_n_minibatches: int = _f(2, "Optimizer steps per train step; each takes 1/n of the step's samples.")
    micro_batch_tokens: int = _f(1024, "Padded tokens (rows x longest row) per trainer forward and backward; rows go in order of length so each micro-batch is padded only to its own longest row, and gradients accumulate (the update is the same). 0: a whole minibatch at once.")
    eps_clip: float = _f(0.2, "PPO clip range: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high].")
    eps_clip_high: Optional[float] = _f(None, "Upper clip range (DAPO clip-higher); None: eps_clip.")
    c_clip: Optional[float] = _f(None, "Dual-clip constant (> 1) bounding the loss of negative advantages; None: off.")
    kl_ctl: float = _f(0.0, "KL-to-reference coefficient; > 0 loads a reference model.")
    use_decoupled_loss: bool = _f(True, "Decoupled PPO loss: clip against recomputed proximal log-probs, weight by pi_prox/pi_behav.")
    recompute_logprob: bool = _f(True, "Recompute the log-probs of the current weights before training (actor_inf).")
    behav_imp_weight_cap: Optional[float] = _f(None, "Zero the loss of tokens whose pi_prox/pi_behav exceeds this (>= 1); None: no cap.")
    reward_output_scaling: float = _f(1.0, "Trainer-side reward transform: (reward + bias) * scaling.")
    reward_output_bias: float = _f(0.0, "Trainer-side reward transform: (reward + bias) * scaling.")
    max_reward_clip: Optional[float] = _f(None, "Clip transformed rewards to [-clip, clip]; None: no clip.")
    discount: float = _f(1.0, "GAE discount gamma (used when group_adv_norm is off).")
    gae_lambda: float = _f(1.0, "GAE lambda (used when group_adv_norm is off).")
    adv_norm: bool = _f(False, "Normalise advantages over all trained tokens of the step (global across DP).")
    group_adv_norm: bool = _f(True, "GRPO advantages: (reward - group mean) / (group std + eps) per prompt group.")
    group_adv_norm_std: bool = _f(True, "With group_adv_norm: divide by the group std (False: Dr.GRPO, mean only).")
    kl_estimator: str = _f("k3", "KL estimator for kl_ctl > 0: 'k1', 'k2' or 'k3'.")


@dataclass
class ExperimentSaveEvalControl:
    total_train_epochs: int = _f(1, "Stop after this many passes over the dataset (epoch = dataset size / B steps).")
    benchmark_steps: int = _f(0, "> 0: stop after this many train steps instead (wins over total_train_epochs).")
    save_freq_steps: int = _f(0, "Save an HF checkpoint every N steps (and at the end); 0: only at the end.")
    ckpt_freq_steps: int = _f(0, "Save a recovery checkpoint (weights + optimizer + RNG) every N steps; 0: off.")
    ckpt_freq_secs: int = _f(0, "Save a recovery checkpoint every N seconds; 0: off.")
    eval_freq_steps: int = _f(0, "Evaluate every N steps; 0: off (evaluation is not wired into the master yet).")


@dataclass
class ModelWorkerConfig:
    actor: ModelTrainEvalConfig = _sub(ModelTrainEvalConfig, "The trained policy.")
    ref: ModelTrainEvalConfig = _sub(ModelTrainEvalConfig, "The reference policy (loaded only when ppo.kl_ctl > 0); empty path: actor.path.")
    ppo: PPOHyperparameters = _sub(PPOHyperparameters, "PPO/GRPO hyper-parameters.")
    fileroot: str = _f("./runs", "Root of param_realloc/ (published weights), checkpoints/ and recover/.")
    bind_host: str = _f("127.0.0.1", "Address the trajectory puller binds to.")
    max_head_offpolicyness: int = _f(4, "eta: never train a group whose version_start < version - eta.")
    total_train_steps: int = _f(0, "Planned optimizer-step horizon for the LR schedule is this x ppo_n_minibatches; 0: constant LR.")
    seed: int = _f(1, "Seed of torch on this worker.")
    stream_queue_size: int = _f(4096, "Prompt groups buffered by this DP head before pushers block.")
    keep_last_versions: int = _f(2, "Published weight versions kept in param_realloc/actor (older ones are deleted).")
    recover: bool = _f(False, "On initialize, resume from the recovery checkpoint under <fileroot>/recover if one exists.")
    distributed_timeout: float = _f(300.0, "Seconds to wait for the torch.distributed rendezvous and collectives.")
    master_discovery_timeout: float = _f(300.0, "Seconds to wait for the master's request socket in name resolve.")


@dataclass
class MasterWorkerConfig:
    n_model_workers: int = _f(1, "Model workers (= DP ranks) to drive.")
    train_batch_size: int = _f(16, "B: prompt groups per train step, summed over DP ranks.")
    group_size: int = _f(8, "Answers per prompt (for throughput numbers only).")
    dataset_size: int = _f(0, "Prompts in the training set; an epoch is dataset_size // B steps.")
    ppo: PPOHyperparameters = _sub(PPOHyperparameters, "Decides the dataflow graph (actor_inf, ref_inf).")
    exp_ctrl: ExperimentSaveEvalControl = _sub(ExperimentSaveEvalControl, "When to stop, save and checkpoint.")
    fileroot: str = _f("./runs", "metrics.jsonl goes to <fileroot>/logs/<experiment>/<trial>/.")
    bind_host: str = _f("127.0.0.1", "Address of the master's request socket.")
    tensorboard_path: str = _f("", "Directory for tensorboard event files; empty: off.")
    wandb_project: str = _f("", "Weights & Biases project to log every step to (needs the wandb extra); empty: off.")
    wandb_mode: str = _f("offline", "wandb mode: 'offline' (files only, no network) or 'online'.")
    worker_connect_timeout: float = _f(300.0, "Seconds to wait for every model worker to connect.")
    request_timeout: float = _f(1800.0, "Seconds to wait for one reply of a model worker (e.g. a train step).")
    data_poll_interval: float = _f(0.2, "Seconds between 'fetch' polls while waiting for a step's data.")
    data_log_interval: float = _f(30.0, "While waiting for data, log progress every N seconds.")
    stall_timeout: float = _f(120.0, "After N seconds without a completed step, log who waits for what (ranks, manager, servers, workers), then every data_log_interval.")
    expected_workers: Dict[str, int] = _f({}, "Worker counts per type, so a stall report can name the missing ones (set by initial_setup).")
    data_timeout: float = _f(3600.0, "Fail the run after N seconds without a full batch.")


# --------------------------------------------------------------------------------------------
# The experiment (training/main_async_ppo.py)
# --------------------------------------------------------------------------------------------
# @@section experiment


@dataclass
class DatasetConfig:
    path: str = _f("assets/tiny-math/data/train.jsonl", "JSONL training prompts (query_id, prompt, solutions, task).")
    test_path: str = _f("assets/tiny-math/data/test.jsonl", "JSONL held-out prompts for the before/after accuracy report.")
    train_bs_n_seqs: int = _f(16, "B: prompt groups per train step (each group has group_size answers).")


@dataclass
class RolloutSetupConfig:
    n_workers: int = _f(2, "Rollout worker processes (at least one per trainer DP rank).")
    agent: AgentConfig = _sub(AgentConfig, "The agent (success_rate_lb/ub are set from the top-level fields).")
    env: EnvConfig = _sub(EnvConfig, "The environment.")
    request_timeout: float = _f(300.0, "Seconds allowed for one /generate call.")


@dataclass
class GenServerSetupConfig:
    native: NativeEngineConfig = _sub(NativeEngineConfig, "The built-in engine (allocation_mode native.*).")
    sglang: SGLangConfig = _sub(SGLangConfig, "SGLang server arguments (allocation_mode sglang.*).")


@dataclass
class EvaluationConfig:
    n_prompts: int = _f(500, "Held-out prompts for the greedy and sampled accuracy before and after training; 0: skip.")
    max_new_tokens: int = _f(32, "Maximum new tokens per answer during evaluation.")
    batch_size: int = _f(128, "Prompts per generate call during evaluation.")
    sampled_temperature: float = _f(1.0, "Temperature of the 'sampled' accuracy (independent of the rollout temperature, so runs compare).")


@dataclass
class AsyncPPOMATHConfig:
    """Asynchronous PPO/GRPO on math prompts: the root of training/configs/async-ppo.yaml."""

    experiment_name: str = _f("async-ppo-math", "Name of the experiment; keys, logs and weights live under it.")
    trial_name: str = _f("trial0", "Name of this run of the experiment; rerunning a name replaces its logs.")
    seed: int = _f(1, "Seed of every worker (each adds its own index where it needs distinct streams).")
    n_nodes: int = _f(1, "Nodes of the cluster (the local launcher runs on one).")
    n_gpus_per_node: int = _f(0, "GPUs per node; 0 on a CPU machine.")
    allocation_mode: str = _f(
        "native.d1m1p1+d1m1p1",
        "'<engine>.d<dp>m<tp>p<pp>+d<dp>m<tp>p<pp>': generation servers, then the trainer (engine native or sglang).",
    )
    cluster: ClusterSpecConfig = _sub(ClusterSpecConfig, "Where files go, how processes find each other.")
    actor: ModelTrainEvalConfig = _sub(ModelTrainEvalConfig, "The trained policy; its path is also the generation servers' initial weights.")
    ref: ModelTrainEvalConfig = _sub(ModelTrainEvalConfig, "Reference policy for the KL term (used only when ppo.kl_ctl > 0; empty path: actor.path).")
    dataset: DatasetConfig = _sub(DatasetConfig, "Training and held-out prompts.")
    group_size: int = _f(8, "Answers sampled per prompt.")
    ppo: PPOHyperparameters = _sub(PPOHyperparameters, "PPO/GRPO and sampling hyper-parameters.")
    max_head_offpolicyness: int = _f(4, "η: a trained token is at most this many versions behind the trainer; 0 = synchronous PPO.")
    max_concurrent_rollouts: int = _f(32, "Prompt groups in flight at once over all rollout workers.")
    new_tokens_per_chunk: int = _f(0, "Resubmit a generation request after this many new tokens (0: no chunking).")
    schedule_policy: str = _f("round_robin", "Server choice: 'round_robin', 'least_requests' or 'least_token_usage'.")
    success_rate_lb: float = _f(0.0, "Drop prompt groups whose success rate is strictly below this.")
    success_rate_ub: float = _f(1.0, "Drop prompt groups whose success rate is strictly above this.")
    exp_ctrl: ExperimentSaveEvalControl = _sub(ExperimentSaveEvalControl, "When to stop, save and checkpoint.")
    recover_mode: str = _f("disabled", "'disabled': start afresh (a rerun replaces the trial's files); 'auto': resume from the trial's last recovery checkpoint if there is one; 'resume': resume, and fail if there is none.")
    stall_timeout: float = _f(120.0, "After N seconds without a completed train step the master logs who waits for what.")
    rollout: RolloutSetupConfig = _sub(RolloutSetupConfig, "Rollout workers, agent and environment.")
    gen_server: GenServerSetupConfig = _sub(GenServerSetupConfig, "Generation server engines.")
    evaluation: EvaluationConfig = _sub(EvaluationConfig, "Accuracy report before and after training.")
    tensorboard_path: str = _f("", "Directory for tensorboard event files; empty: off.")
    wandb_project: str = _f("", "Weights & Biases project to log every step to (needs the wandb extra); empty: off.")
    wandb_mode: str = _f("offline", "wandb mode: 'offline' (files only, no network) or 'online'.")
