#!/usr/bin/env bash
# Lay the installed SGLang wheel's Python tree out as a source checkout -- a stand-in for an
# SGLang pull-request branch, used by docs/gating.md's "try it" step and the recipe test:
#
#   bash ci/engine-gate/make-sglang-branch.sh DEST [VERSION] [PYTHON]
#
# DEST/python/sglang/... is a copy of the sglang package PYTHON (default
# .venv-upstream/bin/python) imports, without __pycache__ and without any compiled extension
# (*.so: a checkout has not built SGLang's Rust tree core), its version declared as VERSION
# (default 0.5.24.dev0: what setuptools-scm says on a branch past the v0.5.23 tag) in
# sglang/_version.py, the file sglang/version.py reads first.  DEST must not exist yet.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:?usage: make-sglang-branch.sh DEST [VERSION] [PYTHON]}
VERSION=${2:-0.5.24.dev0}
PY=${3:-.venv-upstream/bin/python}
case "$VERSION" in *[!A-Za-z0-9.+-]*|"") echo "bad version '$VERSION'" >&2; exit 2;; esac
if [ -e "$DEST" ]; then echo "$DEST exists already" >&2; exit 2; fi
if [ ! -x "$PY" ]; then echo "$PY not found: build it with bash ci/upstream/setup.sh" >&2; exit 2; fi
PKG=$("$PY" -c 'import importlib.util as u; s = u.find_spec("sglang"); print(s.submodule_search_locations[0] if s else "")')
if [ -z "$PKG" ]; then echo "sglang is not installed in $PY" >&2; exit 2; fi
mkdir -p "$DEST/python"
# a plain copy, then drop what a checkout does not have (no rsync on every box)
cp -r "$PKG" "$DEST/python/sglang"
find "$DEST/python/sglang" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$DEST/python/sglang" -name '*.so' -delete
cat > "$DEST/python/sglang/_version.py" <<PY
# written by kvcheck's ci/engine-gate/make-sglang-branch.sh (setuptools-scm writes this file)
__version__ = version = '$VERSION'
__version_tuple__ = version_tuple = tuple('$VERSION'.split('.'))
__commit_id__ = commit_id = None
PY
echo "sglang $VERSION branch stand-in at $DEST (python/sglang from $PKG, no compiled extension)"
