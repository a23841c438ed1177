#!/usr/bin/env bash
# The gate from an installed package: build the wheel, install it into a clean virtualenv
# (system site-packages for torch and hypothesis; kvcheck itself only from the wheel), then run
# a short gate from a folder outside the checkout.  It must replay the corpus the wheel carries
# (state_machines/corpus/, copied there by setup.py) and pass.  Run alone, or as .ci/run's
# wheel-gate stage:  bash ci/wheel-gate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --no-deps -q -w "$work/dist" .
python3 -m venv --system-site-packages "$work/venv"
# --ignore-installed: a kvcheck installed in the system site-packages (editable) must not
# satisfy the requirement in place of the wheel
"$work/venv/bin/python" -m pip install -q --no-deps --ignore-installed "$work"/dist/kvcheck-*.whl
mkdir "$work/elsewhere"
cd "$work/elsewhere"
unset PYTHONPATH
where=$("$work/venv/bin/python" -c 'import state_machines; print(state_machines.__file__)')
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "wheel-gate: state_machines from $where"
case $where in
  "$site"/*) ;;
  *) echo "wheel-gate: kvcheck is not the wheel's (expected under $site)" >&2; exit 1 ;;
esac
case $where in
  "$checkout"/*) echo "wheel-gate: kvcheck comes from the checkout, not the wheel" >&2; exit 1 ;;
esac
"$work/venv/bin/kvcheck" gate --variant radix --budget 60 | tee "$work/gate.out"
# the corpus was replayed (not "nothing replayed"): at least one trace ran
grep -q "^ok  *replay " "$work/gate.out" \
  || { echo "wheel-gate: no corpus trace was replayed" >&2; exit 1; }
