#!/usr/bin/env bash
# The embedded default: asynchronous PPO on the tiny arithmetic task, on this machine's CPU.
# Sets up .venv and redis-server if needed, then runs training/main_async_ppo.py; any arguments
# are Hydra overrides, e.g.
#   bash examples/run_async_ppo.sh exp_ctrl.benchmark_steps=20 trial_name=t1
# Without trial_name each run gets a fresh one, so rerunning this script keeps earlier runs; a
# trial_name that already has files needs overwrite=true (start afresh) or recover_mode=auto (resume).
#   bash examples/run_async_ppo.sh max_head_offpolicyness=0 ppo.use_decoupled_loss=false   # synchronous baseline
#   bash examples/run_async_ppo.sh cluster.launcher=ray    # under Ray (installed on first use)
#   bash examples/run_async_ppo.sh allocation_mode=vllm.d1m1p1+d1m1p1   # vLLM generating (installed on first use)
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras=()
for arg in "$@"; do
  case "${arg}" in
    cluster.launcher=ray) extras+=(ray) ;;
    allocation_mode=vllm.*) extras+=(vllm) ;;  # vLLM's own environment, .venv-vllm (first use: minutes)
  esac
done
bash "${REPO_ROOT}/scripts/setup_env.sh" "${extras[@]}"
cd "${REPO_ROOT}"
exec "${REPO_ROOT}/.venv/bin/python" training/main_async_ppo.py "$@"
