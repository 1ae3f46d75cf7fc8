"""The `vllm` backend's command line: realhf's server around vLLM, from vLLM's own environment.

vLLM is never imported in the worker that starts it: its pins (transformers, fastapi) differ from
the project's, so it lives in an environment of its own (`bash scripts/setup_env.sh vllm` makes
`.venv-vllm`), and its interpreter runs `realhf.launch_vllm_server` with this clone's
realhf first on its path. The process is a `realhf.impl.inference.server_process.ServerProcess`.
"""

from __future__ import annotations

import os
import subprocess
from typing import Dict, List

from realhf.api.cli_args import VLLMConfig

# VLLMConfig's fields that are the launcher's, not the server's.
LAUNCHER_FIELDS = ("python", "startup_timeout")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEFAULT_PYTHON = os.path.join(REPO_ROOT, ".venv-vllm", "bin", "python")
SETUP_HINT = "bash scripts/setup_env.sh vllm"


class VLLMMissing(RuntimeError):
    """vLLM's environment is not there or cannot import vLLM; says how to make it."""


def vllm_python(cfg: VLLMConfig, check: bool = True) -> str:
    """The interpreter that runs the server: gen_server.vllm.python, else .venv-vllm's. With
    `check`, it must exist and import vllm (seconds: the import is what starts the server too)."""
    python = cfg.python or DEFAULT_PYTHON
    field = "gen_server.vllm.python"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise VLLMMissing(
            f"{field}={cfg.python or '(empty)'}: no interpreter at {python}; `{SETUP_HINT}` makes "
            f"{DEFAULT_PYTHON} (vLLM's CPU build, or vLLM where nvidia-smi finds a GPU), or point "
            f"{field} at an environment that has vllm and realhf's requirements"
        )
    if check:
        proc = subprocess.run(
            [python, "-c", "import vllm"], capture_output=True, text=True, timeout=300, env=server_env({})
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            raise VLLMMissing(f"{field}: {python} cannot import vllm (`{SETUP_HINT}` installs it):\n{tail}")
    return python


def per_server_cores(cores: List[int], index: int, count: int) -> str:
    """cpu_threads_bind=per_server: server `index` of `count` takes its own slice of `cores` (the
    i-th count-th, at least one core; more servers than cores share round-robin), as vLLM's
    core-list syntax ('2', '0-3', or '0,2' where the slice is not contiguous)."""
    if not cores or count < 1 or not 0 <= index < count:
        raise ValueError(f"per_server binding: server {index} of {count} over cores {cores}")
    width = max(len(cores) // count, 1)
    start = (index * width) % len(cores)
    mine = sorted(cores[start : start + width])
    if mine == list(range(mine[0], mine[-1] + 1)):
        return str(mine[0]) if len(mine) == 1 else f"{mine[0]}-{mine[-1]}"
    return ",".join(str(c) for c in mine)


def server_env(extra: Dict[str, str]) -> Dict[str, str]:
    """The child's environment: offline, this clone's realhf first on its path (the server speaks
    the same protocol version as the worker that starts it), plus `extra`."""
    env = dict(os.environ)
    # A weights folder that is missing must fail at once, not be looked up on the hub for 30 s
    # (realhf resolves hub names to local folders before any server starts).
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = REPO_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


def build_vllm_command(
    python: str,
    model_path: str,
    host: str,
    port: int,
    cfg: VLLMConfig,
    *,
    seed: int = 1,
    weight_version: int = 0,
    gpu_share: float = 1.0,
    secret_file: str = "",
    weights_root: str = "",
    max_request_bytes: int = 0,
) -> List[str]:
    """`python -m realhf.launch_vllm_server ...`: every VLLMConfig field the server takes,
    by its option name."""
    if not model_path:
        raise ValueError("vllm backend: model_path is empty")
    if not 0 < gpu_share <= 1:
        raise ValueError(f"vllm backend: gpu_share must lie in (0, 1], got {gpu_share}")
    cmd = [python, "-m", "realhf.launch_vllm_server", "--model-path", model_path]
    cmd += ["--host", host, "--port", str(port), "--seed", str(seed), "--weight-version", str(weight_version)]
    cmd += ["--gpu-share", f"{gpu_share:.6g}"]
    if secret_file:
        cmd += ["--secret-file", secret_file]
    if weights_root:
        cmd += ["--weights-root", weights_root]
    if max_request_bytes:
        cmd += ["--max-request-bytes", str(max_request_bytes)]
    for name, value in vars(cfg).items():
        if name in LAUNCHER_FIELDS:
            continue
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            cmd.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            cmd += [flag, str(value)]
    return cmd
