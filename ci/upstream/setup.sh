#!/usr/bin/env bash
# Build the upstream environment for `kvcheck ... --target sglang`: a separate virtualenv
# (default .venv-upstream, git-ignored) with the CPU torch and SGLang's pinned release plus
# exactly the packages its KV-cache modules need to import, from ci/upstream/sglang.txt, all
# --no-deps (so nothing can replace the CPU torch or pull torchvision).  kvcheck itself is put
# into the venv editable (`pip install --no-deps -e .`), re-done on every run (so a venv kept
# elsewhere follows the checkout it is used from).  The
# core install (ci/setup.sh) never sees any of this.
#
#   bash ci/upstream/setup.sh          # then: .venv-upstream/bin/kvcheck fuzz radix --target sglang
#   bash ci/upstream/setup.sh 0.5.12.post1   # a historical release: .venv-upstream-0.5.12.post1
#
# One env per release.  With no argument it builds the newest pinned release (the sglang== line
# of ci/upstream/sglang.txt) into .venv-upstream.  With a VERSION it builds that release into
# .venv-upstream-VERSION from ci/upstream/sglang-VERSION.txt when there is one (a list frozen
# for that release), else from sglang.txt with only its sglang== line changed.
#
# Idempotent: when the virtualenv was built from this exact list it only re-checks the import.
#   UPSTREAM_VENV  where to build it (default .venv-upstream in the repo)
#   TORCH_SPEC     torch requirement (default torch==2.13.0, the local CPU wheel on these boxes)
#   PYTHON         the interpreter to build it from (default python3; 3.11 is what the list pins)
set -euo pipefail
cd "$(dirname "$0")/../.."
TORCH=${TORCH_SPEC:-torch==2.13.0}
LIST=ci/upstream/sglang.txt
NEWEST=$(sed -n 's/^sglang==//p' "$LIST")
VERSION=${1:-$NEWEST}
case "$VERSION" in *[!A-Za-z0-9.+-]*|"") echo "bad sglang version '$VERSION'" >&2; exit 2;; esac
if [ "$VERSION" = "$NEWEST" ]; then
  VENV=${UPSTREAM_VENV:-.venv-upstream}
else
  VENV=${UPSTREAM_VENV:-.venv-upstream-$VERSION}
  if [ -f "ci/upstream/sglang-$VERSION.txt" ]; then
    LIST="ci/upstream/sglang-$VERSION.txt"
  else
    mkdir -p .kvcheck
    sed "s/^sglang==.*/sglang==$VERSION/" ci/upstream/sglang.txt > ".kvcheck/sglang-$VERSION.txt"
    LIST=".kvcheck/sglang-$VERSION.txt"
  fi
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
# shellcheck source=ci/upstream/venv.sh
. ci/upstream/venv.sh
build_venv "$VENV" "$LIST" "$TORCH"
install_kvcheck "$VENV"
# the proof it works: the real classes load (through kvcheck's loader and its two stand-ins)
"$VENV/bin/python" -W ignore - <<'PY'
from caches.adapters.sglang import loader
reason = loader.unavailable_reason()
if reason:
    raise SystemExit(f"upstream env is broken: {reason}")
ns = loader.load()
import torch
print(f"sglang {ns.version} loads on torch {torch.__version__} (stand-ins: {', '.join(ns.stand_ins) or 'none'})")
PY
echo "upstream env $VENV ready in $(( $(date +%s) - start ))s, $(du -sh "$VENV" | cut -f1) on disk"
