#!/usr/bin/env bash
# Runs the test suite in three lanes: sets up .venv and redis-server if needed, then pytest per lane.
#   bash scripts/test.sh                  # every lane in order (what CI runs; slow tests skipped)
#   bash scripts/test.sh checks           # lint, import floors, docs, config rules (seconds)
#   bash scripts/test.sh unit             # in-process tests (no process, server or process group started)
#   bash scripts/test.sh system           # tests that start processes, servers, process groups; whole runs
#   bash scripts/test.sh --runslow        # every lane, slow tests included (any lane takes it too)
#   bash scripts/test.sh tests/unit/base -k name_resolve   # plain pytest arguments: no lanes
# Each lane is a pytest marker (tests/conftest.py sorts every test into one); the slowest 25 tests
# of the run are printed at the end (docs/testing.md: the lanes, their times, what is slow-only).
set -euo pipefail
suite_start=$(date +%s)
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"

lanes=()
while [ $# -gt 0 ]; do
  case "$1" in
    checks|unit|system) lanes+=("$1"); shift ;;
    *) break ;;
  esac
done
if [ ${#lanes[@]} -eq 0 ]; then
  for a in "$@"; do
    case "${a}" in -*) ;; *) lanes=(none); break ;; esac  # a path or a test id: plain pytest
  done
  [ ${#lanes[@]} -gt 0 ] || lanes=(checks unit system)
fi

bash "${REPO_ROOT}/scripts/setup_env.sh" test ray
PY="${REPO_ROOT}/.venv/bin/python"
reports="$(mktemp -d)"
vllm_setup=""
# An interrupted run leaves no pip behind (the set-up's own children first).
trap 'if [ -n "${vllm_setup}" ]; then pkill -P "${vllm_setup}" 2>/dev/null; kill "${vllm_setup}" 2>/dev/null; fi; rm -rf "${reports}"' EXIT

# .venv-vllm (vLLM's CPU build, for tests/system/engines) installs while the checks and unit lanes
# run: ≈ 90 s of pip the suite does not wait for. Only the system lane (or plain pytest) needs it.
VLLM_SETUP_TIMEOUT_S=1200  # a stuck pip (an unreachable index) ends the run, saying so
if [[ " ${lanes[*]} " == *" system "* ]] || [ "${lanes[0]}" = none ]; then
  timeout "${VLLM_SETUP_TIMEOUT_S}" bash "${REPO_ROOT}/scripts/setup_env.sh" --only-vllm > "${reports}/vllm-setup.log" 2>&1 &
  vllm_setup=$!
fi
wait_for_vllm_setup() {
  [ -n "${vllm_setup}" ] || return 0
  local rc=0
  wait "${vllm_setup}" || rc=$?
  vllm_setup=""
  cat "${reports}/vllm-setup.log"
  if [ ${rc} -eq 124 ]; then
    echo "[test] setting up .venv-vllm did not finish within ${VLLM_SETUP_TIMEOUT_S}s (pip's output above)" >&2
  elif [ ${rc} -ne 0 ]; then
    echo "[test] setting up .venv-vllm failed (exit ${rc}, pip's output above)" >&2
  fi
  [ ${rc} -eq 0 ] || exit ${rc}
}

# Where each lane's tests are (tests/conftest.py puts each test in one lane: by folder, or its mark).
declare -A LANE_PATHS=([checks]="tests/checks" [unit]="tests/unit" [system]="tests/system examples tests/unit")
# In-process tests run on every core (2 on CI: 104 s -> 64 s). Tests that start processes run two at
# a time: a whole run keeps about one of two cores busy (1,532 CPU-s in 1,445 s of the lane), so two
# at once took the lane 1,456 s -> 1,027 s; more than two would stretch their timed waits.
declare -A LANE_OPTIONS=([checks]="" [unit]="-n auto --maxprocesses 4" [system]="-n auto --maxprocesses 2")

code=0
summary=()
for lane in "${lanes[@]}"; do
  if [ "${lane}" = system ] || [ "${lane}" = none ]; then wait_for_vllm_setup; fi
  start=$(date +%s)
  set +e
  if [ "${lane}" = none ]; then
    "${PY}" -m pytest -q --junitxml="${reports}/${lane}.xml" "$@"
  else
    echo "[test] lane ${lane}"
    "${PY}" -m pytest -q -m "${lane}" --junitxml="${reports}/${lane}.xml" ${LANE_OPTIONS[${lane}]} "$@" ${LANE_PATHS[${lane}]}
  fi
  lane_code=$?
  set -e
  # 5: nothing collected (a lane a pytest filter emptied), not a failure
  if [ ${lane_code} -ne 0 ] && [ ${lane_code} -ne 5 ]; then code=${lane_code}; fi
  summary+=("${lane/#none/pytest} exited ${lane_code} after $(( $(date +%s) - start ))s")
done
wait_for_vllm_setup  # a run of checks or unit alone never started it; nothing is left behind
"${PY}" -m scripts.slowest_tests "${reports}"/*.xml --top 25 || true
# Every test's time, for whoever trims the suite next: runs/test-reports/<lane>.xml (ignored by git).
mkdir -p "${REPO_ROOT}/runs/test-reports" && cp "${reports}"/*.xml "${REPO_ROOT}/runs/test-reports/" 2>/dev/null || true
for line in "${summary[@]}"; do echo "[test] lane ${line}"; done
# Lane times depend on the host (docs/testing.md gives them per host: cores, AVX-512 or AVX2 only).
if grep -q -w avx512f /proc/cpuinfo 2>/dev/null; then simd="AVX-512"
elif grep -q -w avx2 /proc/cpuinfo 2>/dev/null; then simd="AVX2 only"
else simd="no AVX2"; fi
echo "[test] ${#summary[@]} lane(s) and the set-up took $(( $(date +%s) - suite_start ))s on $(nproc) cores, ${simd}"
exit ${code}
