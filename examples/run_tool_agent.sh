#!/usr/bin/env bash
# A tool-using agent on the embedded model: the tiny arithmetic problems answered by calling the
# calculator (realhf/plugins/tasks/tool_task.py). The model in assets/tiny-tools/sft was warm-started
# on calculator traces (scripts/make_tool_task.py); this RL-trains it with the tool-agent and
# prints the reward curve. Sets up .venv and redis-server if needed; arguments are Hydra
# overrides, e.g.
#   bash examples/run_tool_agent.sh exp_ctrl.benchmark_steps=40
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "${REPO_ROOT}/scripts/setup_env.sh"
cd "${REPO_ROOT}"
PY="${REPO_ROOT}/.venv/bin/python"
TASK=assets/tiny-tools
if [ ! -f "${TASK}/sft/model.safetensors" ]; then
  "${PY}" scripts/make_tool_task.py --out "${TASK}"            # data, base model, warm start (~2 min)
elif [ ! -f "${TASK}/data/train.jsonl" ]; then
  "${PY}" scripts/make_tool_task.py --out "${TASK}" --data-only
fi
exec "${PY}" training/main_async_ppo.py experiment_name=tool-agent \
  actor.path="${TASK}/sft" dataset.path="${TASK}/data/train.jsonl" dataset.test_path="${TASK}/data/test.jsonl" \
  dataset.chat_template=on rollout.agent.type=tool-agent +rollout.agent.args.max_turns=2 \
  rollout.env.check_work=false ppo.gen.max_new_tokens=64 evaluation.n_prompts=0 exp_ctrl.benchmark_steps=150 "$@"
