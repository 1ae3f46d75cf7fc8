#!/usr/bin/env bash
# The long-reasoning task: answers that add up `count` packs one worked line at a time, 8 to about
# 530 tokens long, most short and a few long (realhf/plugins/tasks/long_math.py). The model in
# assets/tiny-long/sft was warm-started by scripts/make_long_math_task.py; this RL-trains it
# (training/configs/async-ppo-long.yaml), evaluates it on 500 held-out problems before and after,
# and prints the reward curve. Sets up .venv and redis-server if needed; arguments are Hydra
# overrides, e.g.
#   bash examples/run_long_math.sh exp_ctrl.benchmark_steps=40
#   bash examples/run_long_math.sh dataset.test_path=assets/tiny-long/data/longer.jsonl   # longer than training
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${REPO_ROOT}/scripts/setup_env.sh"
cd "${REPO_ROOT}"
PY="${REPO_ROOT}/.venv/bin/python"
TASK=assets/tiny-long
if [ ! -f "${TASK}/sft/model.safetensors" ]; then
  "${PY}" scripts/make_long_math_task.py --out "${TASK}"            # data, base model, warm start (~4 min)
elif [ ! -f "${TASK}/data/longer.jsonl" ]; then
  "${PY}" scripts/make_long_math_task.py --out "${TASK}" --data-only
fi
exec "${PY}" training/main_async_ppo.py --config-name async-ppo-long "$@"
