#!/usr/bin/env bash
# Set up a fresh machine for kvcheck: the CPU build of torch first (so nothing resolves torch
# to a multi-GB CUDA build), then kvcheck itself with its test extras, in the current Python
# (activate a virtualenv first if you want one).  Idempotent.
#   TORCH_SPEC   torch requirement to install (default: torch==2.13.0, CPU wheel on this box)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$PY" -c 'import torch' 2>/dev/null; then
  "$PY" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
fi
"$PY" -m pip install -q -e ".[test]"
echo "kvcheck set up in $(( $(date +%s) - start ))s: $("$PY" -c 'import torch, hypothesis; print("torch", torch.__version__, "hypothesis", hypothesis.__version__)')"
