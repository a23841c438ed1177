#!/usr/bin/env bash
# CrossHair on the pure arithmetic with contracts (caches/arith.py), with a time bound.
#   CROSSHAIR_TIMEOUT        whole-run bound in seconds (default 120)
#   CROSSHAIR_PER_CONDITION  seconds per postcondition (default 4)
# Exit 0: no counterexample found within the bound; 1: a counterexample (printed as
# "file:line: error: false when calling f(...)"); 124: the bound was hit; 2: crosshair missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import crosshair' 2>/dev/null; then
  echo "crosshair-tool is not installed (pip install -e '.[test]')" >&2
  exit 2
fi
start=$(date +%s)
timeout "${CROSSHAIR_TIMEOUT:-120}" "$PY" -m crosshair check --analysis_kind=PEP316 \
  --per_condition_timeout="${CROSSHAIR_PER_CONDITION:-4}" caches/arith.py
echo "crosshair: caches/arith.py: no counterexample ($(( $(date +%s) - start ))s)"
