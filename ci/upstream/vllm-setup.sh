#!/usr/bin/env bash
# Build the upstream environment for `kvcheck ... --target vllm`: a separate virtualenv (default
# .venv-vllm, git-ignored) with the CPU torch, vllm 0.33.0 and exactly the packages importing its
# KV cache manager needs, from ci/upstream/vllm.txt, all --no-deps (so nothing can replace the
# CPU torch).  kvcheck itself goes in editable (`pip install --no-deps -e .`), re-done on every
# run.  The core install (ci/setup.sh) never sees any of this.  (The SGLang env is
# ci/upstream/setup.sh; the same steps over another list.)
#
#   bash ci/upstream/vllm-setup.sh     # then: .venv-vllm/bin/kvcheck fuzz block-hash --target vllm
#
# Idempotent: when the virtualenv was built from this exact list it only re-checks the import.
#   UPSTREAM_VENV  where to build it (default .venv-vllm in the repo)
#   TORCH_SPEC     torch requirement (default torch==2.13.0, the local CPU wheel on these boxes)
#   PYTHON         the interpreter to build it from (default python3; 3.11 is what the list pins)
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH=${TORCH_SPEC:-torch==2.13.0}
LIST=ci/upstream/vllm.txt
VENV=${UPSTREAM_VENV:-.venv-vllm}
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
# shellcheck source=ci/upstream/venv.sh
. ci/upstream/venv.sh
build_venv "$VENV" "$LIST" "$TORCH"
install_kvcheck "$VENV"
# the proof it works: the real classes load through kvcheck's loader
"$VENV/bin/python" -W ignore - <<'PY'
from caches.adapters.vllm import loader
reason = loader.unavailable_reason()
if reason:
    raise SystemExit(f"upstream env is broken: {reason}")
import torch
print(f"vllm {loader.version()} loads on torch {torch.__version__}")
PY
echo "upstream env $VENV ready in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1) on disk"
