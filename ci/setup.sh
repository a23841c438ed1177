#!/usr/bin/env bash
# Set up a fresh machine for kvcheck: the CPU build of torch first (so nothing resolves torch
# to a multi-GB CUDA build), then kvcheck itself with its test and engines extras, in the
# current Python (activate a virtualenv first if you want one).  Idempotent.
#   TORCH_SPEC   torch requirement to install (default: torch==2.13.0, CPU wheel on this box)
#   --system     also install the Debian packages some tests use: redis-server (the nightly
#                job's shared Redis database) and chromium (headless render of replay pages)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! "$PY" -c 'import torch' 2>/dev/null; then
  # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options (--index-url ...)
  "$PY" -m pip install -q ${TORCH_SPEC:-torch==2.13.0}
fi
# engines: what the caches of the engines run from a checkout (--src) import;
# tokenspeed: TokenSpeed's compiled scheduler (the tokenspeed target)
"$PY" -m pip install -q -e ".[test,engines,tokenspeed]"
if [ "${1:-}" = "--system" ]; then
  if ! command -v redis-server >/dev/null || ! command -v chromium >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      redis-server chromium >/dev/null
  fi
fi
echo "kvcheck set up in $(( $(date +%s) - start ))s: $("$PY" -c 'import torch, hypothesis; print("torch", torch.__version__, "hypothesis", hypothesis.__version__)')"
