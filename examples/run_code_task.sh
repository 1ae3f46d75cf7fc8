#!/usr/bin/env bash
# A second built-in task, not math: write a one-line Python function from three of its calls
# (realhf/plugins/tasks/code_task.py), rewarded by running four hidden calls in the sandbox
# (rollout.env.type=code, realhf/plugins/environments/code_env.py). The model in assets/tiny-code/sft
# was warm-started on reference bodies (scripts/make_code_task.py); this RL-trains it with the
# math-single-step agent (one answer, graded by the environment), evaluates it through the code
# environment before and after, and prints the reward curve. Sets up .venv and redis-server if
# needed; arguments are Hydra overrides, e.g.
#   bash examples/run_code_task.sh exp_ctrl.benchmark_steps=40
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${REPO_ROOT}/scripts/setup_env.sh"
cd "${REPO_ROOT}"
PY="${REPO_ROOT}/.venv/bin/python"
TASK=assets/tiny-code
if [ ! -f "${TASK}/sft/model.safetensors" ]; then
  "${PY}" scripts/make_code_task.py --out "${TASK}"            # data, base model, warm start (~2 min)
elif [ ! -f "${TASK}/data/train.jsonl" ]; then
  "${PY}" scripts/make_code_task.py --out "${TASK}" --data-only
fi
exec "${PY}" training/main_async_ppo.py experiment_name=code-task \
  actor.path="${TASK}/sft" dataset.path="${TASK}/data/train.jsonl" dataset.test_path="${TASK}/data/test.jsonl" \
  rollout.env.type=code ppo.gen.max_new_tokens=16 evaluation.max_new_tokens=16 exp_ctrl.benchmark_steps=300 "$@"
