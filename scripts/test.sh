#!/usr/bin/env bash
# Runs the test suite: sets up .venv and redis-server if needed, then pytest.
#   bash scripts/test.sh                 # the CI suite (slow tests skipped)
#   bash scripts/test.sh --runslow       # everything
#   bash scripts/test.sh tests/unit/base -k name_resolve   # any pytest arguments
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# vllm: .venv-vllm, for the tests that run vLLM's CPU build as a generation server (tests/system/engines).
bash "${REPO_ROOT}/scripts/setup_env.sh" test ray vllm
cd "${REPO_ROOT}"
start=$(date +%s)
set +e
"${REPO_ROOT}/.venv/bin/python" -m pytest -q "$@"
code=$?
set -e
echo "[test] pytest exited with ${code} after $(( $(date +%s) - start ))s"
exit ${code}
