#!/usr/bin/env bash
# The gate's regression corpus: real upstream KV-cache fixes (SGLang, vLLM, LightLLM, pymllm),
# each reverted onto the pinned tree kvcheck drives, must turn the gate red -- on a property, in
# every run -- and each unmodified tree must pass.
#
#   bash ci/engine-gate/regression-corpus.sh [-n RUNS] [--only NAME]... [--check] [--no-clean]
#                                            [-- EXTRA GATE ARGS]
#
# Each ci/engine-gate/reverts/<name>.patch is our own minimal diff against a pinned tree; its
# header cites the upstream PR it reverts ("# upstream: ..."), names the property the fix
# protects ("# protects: PROPERTY") and the engine ("# target: T"; absent = sglang).  The target
# picks the pinned tree laid out as a branch and the kvcheck that gates it:
#     sglang    the 0.5.23 wheel of .venv-upstream (make-sglang-branch.sh)
#               .venv-upstream/bin/kvcheck gate --target sglang --src BRANCH
#     vllm      the vllm 0.33.0 Python tree of .venv-vllm (no *.so, no bytecode)
#               .venv-vllm/bin/python -m state_machines gate --target vllm --src BRANCH
#     lightllm  a copy of the snapshot ../shared/upstream/lightllm-87881ae7ca
#     pymllm    a copy of the snapshot ../shared/upstream/mllm-b9c307020b
#               python3 -m state_machines gate --target T --src BRANCH   (the core env)
# (snapshots are found as tests/upstream/snapshots.py finds them: $KVCHECK_SNAPSHOTS,
# ../shared/upstream, /work/shared/upstream; the envs can be moved with KVCHECK and
# KVCHECK_PYTHON for SGLang, KVCHECK_VLLM_PYTHON, KVCHECK_CORE_PYTHON).  For each selected patch: a fresh copy of its
# target's tree, the patch applied, the gate run RUNS times (default 3); then, once per target
# among the selected patches, the unmodified tree ("(unmodified T)"), which must exit 0.  A
# patch's header may name gate arguments of its own ("# gate-args: ...", e.g. extra targets).
# EXTRA GATE ARGS (after --) narrow every gate, e.g. "-- --variant himamba --budget 120": a
# quick mode; the table of docs/gating.md says which rows were narrowed.
#
# The table: revert, each run's exit code, the property each run reported (the failing fuzz
# items' properties), the shrunk steps of the first failure, the wall time of each run.  A run
# counts as caught only when it exits 1 with a failure on the property the fix protects; a
# harness error ("harness error:" in a verdict, anywhere in the run) is never a catch.
# --check: only check that every selected patch applies cleanly to its pinned tree; --no-clean:
# leave the unmodified trees out (a partial run: the verdict then says nothing about them).
# A target whose environment is missing (.venv-upstream, .venv-vllm, a snapshot) stops the run
# with a message saying how to build it.  Exit 0 when every revert was caught in every run and
# every clean tree exited 0 every time; 1 otherwise; 2 on a bad argument, a missing environment
# or a patch that does not apply.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
RUNS=3
ONLY=()
CHECK=0
NOCLEAN=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) RUNS=${2:?-n RUNS}; shift 2 ;;
    --only) ONLY+=("${2:?--only NAME}"); shift 2 ;;
    --check) CHECK=1; shift ;;
    --no-clean) NOCLEAN=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$RUNS" in ''|*[!0-9]*|0) echo "-n wants a positive count" >&2; exit 2 ;; esac
# the environments (overridable: KVCHECK / KVCHECK_PYTHON, the SGLang ones, as before)
SGLANG_KVCHECK=${KVCHECK:-$ROOT/.venv-upstream/bin/kvcheck}
SGLANG_PY=${KVCHECK_PYTHON:-$ROOT/.venv-upstream/bin/python}  # the env whose sglang is laid out
VLLM_PY=${KVCHECK_VLLM_PYTHON:-$ROOT/.venv-vllm/bin/python}
CORE_PY=${KVCHECK_CORE_PYTHON:-python3}
TARGETS="sglang vllm lightllm pymllm"

target_of() {  # the engine a patch reverts a fix of: its "# target:" header, else sglang
  local t
  t=$(sed -n 's/^# target: \([a-z]*\).*/\1/p' "$1" | head -1)
  echo "${t:-sglang}"
}
protects() {  # the property a patch's header says the fix protects
  sed -n 's/^# protects: \([a-z-]*\).*/\1/p' "$1" | head -1
}
snapshot_dir() {  # snapshot_dir NAME: where the snapshot NAME is (tests/upstream/snapshots.py)
  local root
  for root in ${KVCHECK_SNAPSHOTS:+"$KVCHECK_SNAPSHOTS"} "$ROOT/../shared/upstream" \
      /work/shared/upstream; do
    if [ -d "$root/$1" ]; then (cd "$root/$1" && pwd -P); return 0; fi
  done
  return 1
}
snapshot_name() {  # the pinned snapshot of a snapshot target
  case "$1" in lightllm) echo lightllm-87881ae7ca ;; pymllm) echo mllm-b9c307020b ;; esac
}

env_missing() {  # env_missing TARGET [gate]: why TARGET cannot be laid out (or gated); empty: it can
  local t=$1 gate=${2:-}
  case "$t" in
    sglang)
      if [ ! -x "$SGLANG_PY" ]; then echo "$SGLANG_PY not found: bash ci/upstream/setup.sh"
      elif [ -n "$gate" ] && [ ! -x "$SGLANG_KVCHECK" ]; then
        echo "$SGLANG_KVCHECK not found: bash ci/upstream/setup.sh"
      fi ;;
    vllm)
      if [ ! -x "$VLLM_PY" ]; then echo "$VLLM_PY not found: bash ci/upstream/vllm-setup.sh"
      elif ! "$VLLM_PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' \
          2>/dev/null; then
        echo "vllm is not installed in $VLLM_PY: bash ci/upstream/vllm-setup.sh"
      fi ;;
    lightllm|pymllm)
      snapshot_dir "$(snapshot_name "$t")" >/dev/null ||
        echo "the snapshot $(snapshot_name "$t") is absent (looked in \$KVCHECK_SNAPSHOTS," \
             "$ROOT/../shared/upstream, /work/shared/upstream)"
      if [ -n "$gate" ] && ! command -v "$CORE_PY" >/dev/null; then echo "$CORE_PY not found"; fi ;;
    *) echo "unknown target '$t' (one of: $TARGETS)" ;;
  esac
}

lay_out() {  # lay_out TARGET DEST: the pinned tree of TARGET as a checkout at DEST
  local t=$1 dest=$2 pkg
  case "$t" in
    sglang) bash ci/engine-gate/make-sglang-branch.sh "$dest" 0.5.24.dev0 "$SGLANG_PY" >/dev/null ;;
    vllm)
      pkg=$("$VLLM_PY" -c 'import importlib.util as u; print(u.find_spec("vllm").submodule_search_locations[0])') &&
        mkdir -p "$dest" && cp -r "$pkg" "$dest/vllm" ;;
    lightllm|pymllm) cp -r "$(snapshot_dir "$(snapshot_name "$t")")" "$dest" && rm -rf "$dest/.git" ;;
  esac || return 1
  # what a checkout does not have: bytecode, compiled extensions
  find "$dest" -name __pycache__ -type d -prune -exec rm -rf {} +
  find "$dest" -name '*.so' -delete
}

kvcheck_gate() {  # kvcheck_gate TARGET ARGS...: `kvcheck gate ARGS...` in TARGET's environment
  local t=$1; shift
  case "$t" in
    sglang) "$SGLANG_KVCHECK" gate "$@" ;;
    vllm) PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} "$VLLM_PY" -m state_machines gate "$@" ;;
    *) PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} "$CORE_PY" -m state_machines gate "$@" ;;
  esac
}
gate_words() {  # how the table's header shows TARGET's gate command
  case "$1" in
    sglang) echo "$SGLANG_KVCHECK gate --target sglang" ;;
    vllm) echo "$VLLM_PY -m state_machines gate --target vllm" ;;
    *) echo "$CORE_PY -m state_machines gate --target $1" ;;
  esac
}

PATCHES=()
USED=()  # the targets of the selected patches, in $TARGETS order
for p in ci/engine-gate/reverts/*.patch; do
  name=$(basename "$p" .patch)
  if [ ${#ONLY[@]} -gt 0 ] && [[ ! " ${ONLY[*]} " == *" $name "* ]]; then continue; fi
  PATCHES+=("$p")
done
[ ${#PATCHES[@]} -gt 0 ] || { echo "no revert patch selected" >&2; exit 2; }
for t in $TARGETS; do
  for p in "${PATCHES[@]}"; do
    if [ "$(target_of "$p")" = "$t" ]; then USED+=("$t"); break; fi
  done
done
for p in "${PATCHES[@]}"; do
  t=$(target_of "$p")
  [[ " $TARGETS " == *" $t "* ]] || { echo "$p: unknown target '$t' (one of: $TARGETS)" >&2; exit 2; }
done
for t in "${USED[@]}"; do
  why=$(env_missing "$t" $([ $CHECK = 0 ] && echo gate))
  if [ -n "$why" ]; then echo "target $t: $why" >&2; exit 2; fi
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-corpus.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
for t in "${USED[@]}"; do
  lay_out "$t" "$WORK/pinned-$t" || { echo "could not lay out the pinned $t tree" >&2; exit 2; }
done

branch() {  # branch TARGET NAME [PATCH]: a fresh copy of TARGET's pinned tree, the patch applied
  local t=$1 dest="$WORK/$2"
  rm -rf "$dest"
  cp -r "$WORK/pinned-$t" "$dest"
  if [ -n "${3:-}" ]; then
    if ! patch -s -p1 -d "$dest" --no-backup-if-mismatch -r - <"$3" >"$WORK/$2.patch.log" 2>&1
    then
      echo "$3 does not apply to the pinned $t tree:" >&2
      cat "$WORK/$2.patch.log" >&2
      return 1
    fi
  fi
  echo "$dest"
}

for p in "${PATCHES[@]}"; do
  branch "$(target_of "$p")" "check-$(basename "$p" .patch)" "$p" >/dev/null || exit 2
  grep -q '^# upstream: ' "$p" || { echo "$p: no '# upstream: ' header line" >&2; exit 2; }
  [ -n "$(protects "$p")" ] || { echo "$p: no '# protects: PROPERTY' header line" >&2; exit 2; }
done
if [ $CHECK = 1 ]; then
  echo "all ${#PATCHES[@]} revert patches apply cleanly to their pinned trees (${USED[*]})"
  exit 0
fi

# one gate run: prints "rc|properties|steps|seconds|harness" (properties: of the failing fuzz
# items, comma-separated; steps: the first shrunk trace's length)
gate_run() {
  local t=$1 src=$2 log=$3; shift 3
  local t0 t1 rc
  t0=$(date +%s)
  kvcheck_gate "$t" --target "$t" --src "$src" "$@" "${EXTRA[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s)
  "$CORE_PY" - "$log" "$rc" "$((t1 - t0))" <<'PY'
import re, sys
log, rc, secs = open(sys.argv[1], errors="replace").read(), sys.argv[2], sys.argv[3]
harness = "harness error:" in log or "the harness failed" in log
props = []
for m in re.finditer(r"^property broken: (\S+)", log, re.M):
    if m.group(1) not in props:
        props.append(m.group(1))
steps = ""
block = re.search(r"^FAILED: .*?\n((?:\s+\d+\. .*\n)+)", log, re.M)
if block:
    steps = str(len(re.findall(r"^\s+\d+\. ", block.group(1), re.M)))
print(f"{rc}|{','.join(props) or '-'}|{steps or '-'}|{secs}|{int(harness)}")
PY
}

LOGS=${KVCHECK_CORPUS_LOGS:-kvcheck-corpus-logs}
mkdir -p "$LOGS"
for t in "${USED[@]}"; do
  echo "gate command ($t): $(gate_words "$t") --src BRANCH ${EXTRA[*]}"
done
printf '%-42s %-10s %-28s %-10s %-16s %s\n' revert exits property steps seconds caught
bad=0
row() {  # row TARGET NAME SRC EXPECT(a property | clean) GATE_ARGS...
  local t=$1 name=$2 src=$3 expect=$4; shift 4
  local exits=() props="" steps="" secs=() ok=0 i out rc pr st sc h log
  for i in $(seq 1 "$RUNS"); do
    log="$LOGS/$(tr -c 'A-Za-z0-9.-' _ <<<"$name" | sed 's/_*$//').$i.log"
    out=$(gate_run "$t" "$src" "$log" "$@")
    IFS='|' read -r rc pr st sc h <<<"$out"
    exits+=("$rc"); secs+=("$sc")
    [ -z "$props" ] && props=$pr
    [ -z "$steps" ] && steps=$st
    if [ "$expect" != clean ]; then
      # a catch: exit 1, the property the fix protects among those reported, and no harness
      # error anywhere in the run
      [ "$rc" = 1 ] && [[ ",$pr," == *",$expect,"* ]] && [ "$h" = 0 ] && ok=$((ok + 1))
      [ "$pr" != - ] && [ "$props" != "$pr" ] && props="$props;$pr"
    else
      [ "$rc" = 0 ] && ok=$((ok + 1))
    fi
  done
  local IFS=,
  printf '%-42s %-10s %-28s %-10s %-16s %s\n' "$name" "${exits[*]}" "$props" "$steps" \
    "${secs[*]}" "$ok/$RUNS"
  [ "$ok" = "$RUNS" ] || bad=1
}
for p in "${PATCHES[@]}"; do
  name=$(basename "$p" .patch)
  t=$(target_of "$p")
  src=$(branch "$t" "$name" "$p") || exit 2
  read -r -a args <<<"$(sed -n 's/^# gate-args: //p' "$p" | head -1)"
  row "$t" "$name" "$src" "$(protects "$p")" "${args[@]}"
done
if [ $NOCLEAN = 0 ]; then
  for t in "${USED[@]}"; do
    row "$t" "(unmodified $t)" "$(branch "$t" "clean-$t")" clean
  done
fi
echo "logs: $LOGS/"
exit $bad
