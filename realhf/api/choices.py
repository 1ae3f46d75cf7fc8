"""Every closed list of values a config field may take, defined once (the open ones, policy losses
and advantage estimators, are menus of realhf.api.algorithms).

Hydra/OmegaConf cannot express `Literal`, so choice fields are plain `str`; `realhf.experiments.validation`
checks them against these tuples and the code that acts on a choice imports the same tuple.
"""

from realhf.base.allocation_mode import ENGINES
from realhf.base.device_names import DEVICE_NAMES
from realhf.base.dtypes import DTYPE_NAMES
from realhf.base.placement import PLACEMENT_MODES

GENERATION_BACKENDS = ENGINES  # the <engine> of allocation_mode: "native", "sglang" or "vllm"
NATIVE_ENGINE_KINDS = ("auto", "static_kv", "hf")
DECODE_ATTENTION = ("auto", "kernel", "torch")
DTYPES = DTYPE_NAMES
SCHEDULE_POLICIES = ("round_robin", "least_requests", "least_token_usage")
WEIGHT_SYNC = ("distributed", "disk")
KL_ESTIMATORS = ("k1", "k2", "k3")
REWARD_MODEL_KINDS = ("value_head", "implicit")  # realhf.impl.model.reward_card
PROX_LOGP_METHODS = ("recompute", "loglinear")
CHAT_TEMPLATE_SETTINGS = ("auto", "on", "off")  # dataset.chat_template
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
OPTIMIZERS = ("adam",)
LR_SCHEDULES = ("constant", "cosine")
TRAINER_BACKENDS = ("torch",)
DEVICES = DEVICE_NAMES
GPU_PLACEMENTS = PLACEMENT_MODES  # cluster.gpu_placement: "auto", "separate" or "shared"
RECOVER_MODES = ("disabled", "auto", "resume")
NAME_RESOLVE_BACKENDS = ("redis", "memory")
WANDB_MODES = ("offline", "online")
LAUNCHERS = ("local", "ray")
RAY_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
VLLM_DTYPES = ("float32", "bfloat16", "float16", "auto")
