#!/usr/bin/env bash
# The gate's regression corpus: real upstream SGLang fixes, each reverted onto the pinned tree,
# must turn the gate red -- on a property, in every run -- and the unmodified tree must pass.
#
#   bash ci/engine-gate/regression-corpus.sh [-n RUNS] [--only NAME]... [--check] [--no-clean]
#                                            [-- EXTRA GATE ARGS]
#
# For each ci/engine-gate/reverts/<name>.patch (our own minimal diff against the pinned 0.5.23
# tree; its header cites the upstream PR it reverts, "# upstream: ...", and names the property
# the fix protects, "# protects: PROPERTY"): lay the pinned wheel out as a branch
# (make-sglang-branch.sh), apply the patch, and run
#     .venv-upstream/bin/kvcheck gate --target sglang --src BRANCH [EXTRA GATE ARGS]
# RUNS times (default 3); then the same on the unmodified branch, which must exit 0.  A patch's
# header may name, on a line "# gate-args: ...", gate arguments of its own (extra targets).
# EXTRA GATE ARGS (after --) narrow every gate, e.g. "-- --variant himamba --budget 120": a
# quick mode; the table of docs/gating.md comes from the full gate (no extra args).
#
# The table: revert, each run's exit code, the property each run reported (the failing fuzz
# items' properties), the shrunk steps of the first failure, the wall time of each run.  A run
# counts as caught only when it exits 1 with a failure on the property the fix protects; a
# harness error ("harness error:" in a verdict, anywhere in the run) is never a catch.  --check: only check that every patch
# applies cleanly to the pinned tree; --no-clean: leave the unmodified branch out (a partial
# run: the verdict then says nothing about it).  Exit 0 when every revert was caught in every run and the
# clean branch exited 0 every time; 1 otherwise; 2 on a bad argument or a patch that does not
# apply.
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
KVCHECK=${KVCHECK:-$ROOT/.venv-upstream/bin/kvcheck}
PY=${KVCHECK_PYTHON:-$ROOT/.venv-upstream/bin/python}  # the env whose sglang is laid out
if [ $CHECK = 0 ] && [ ! -x "$KVCHECK" ]; then
  echo "$KVCHECK not found: bash ci/upstream/setup.sh" >&2; exit 2
fi

PATCHES=()
for p in ci/engine-gate/reverts/*.patch; do
  name=$(basename "$p" .patch)
  if [ ${#ONLY[@]} -gt 0 ] && [[ ! " ${ONLY[*]} " == *" $name "* ]]; then continue; fi
  PATCHES+=("$p")
done
[ ${#PATCHES[@]} -gt 0 ] || { echo "no revert patch selected" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvcheck-corpus.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
bash ci/engine-gate/make-sglang-branch.sh "$WORK/pinned" 0.5.24.dev0 "$PY" >/dev/null || exit 2

branch() {  # branch NAME [PATCH]: a fresh copy of the pinned tree, the patch applied
  local dest="$WORK/$1"
  rm -rf "$dest"
  cp -r "$WORK/pinned" "$dest"
  if [ -n "${2:-}" ]; then
    if ! patch -s -p1 -d "$dest" --no-backup-if-mismatch -r - <"$2" >"$WORK/$1.patch.log" 2>&1
    then
      echo "$2 does not apply to the pinned tree:" >&2
      cat "$WORK/$1.patch.log" >&2
      return 1
    fi
  fi
  echo "$dest"
}

protects() {  # the property a patch's header says the fix protects
  sed -n 's/^# protects: \([a-z-]*\).*/\1/p' "$1" | head -1
}
for p in "${PATCHES[@]}"; do
  branch "check-$(basename "$p" .patch)" "$p" >/dev/null || exit 2
  grep -q '^# upstream: ' "$p" || { echo "$p: no '# upstream: ' header line" >&2; exit 2; }
  [ -n "$(protects "$p")" ] || { echo "$p: no '# protects: PROPERTY' header line" >&2; exit 2; }
done
if [ $CHECK = 1 ]; then
  echo "all ${#PATCHES[@]} revert patches apply cleanly to the pinned tree"
  exit 0
fi

# one gate run: prints "rc|properties|steps|seconds|harness" (properties: of the failing fuzz
# items, comma-separated; steps: the first shrunk trace's length)
gate_run() {
  local src=$1 log=$2; shift 2
  local t0 t1 rc
  t0=$(date +%s)
  "$KVCHECK" gate --target sglang --src "$src" "$@" "${EXTRA[@]}" >"$log" 2>&1
  rc=$?
  t1=$(date +%s)
  "$PY" - "$log" "$rc" "$((t1 - t0))" <<'PY'
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
echo "gate command: $KVCHECK gate --target sglang --src BRANCH ${EXTRA[*]}"
printf '%-28s %-10s %-28s %-10s %-16s %s\n' revert exits property steps seconds caught
bad=0
row() {  # row NAME SRC EXPECT(a property | clean) GATE_ARGS...
  local name=$1 src=$2 expect=$3; shift 3
  local exits=() props="" steps="" secs=() ok=0 i out rc pr st sc h
  for i in $(seq 1 "$RUNS"); do
    out=$(gate_run "$src" "$LOGS/$name.$i.log" "$@")
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
  printf '%-28s %-10s %-28s %-10s %-16s %s\n' "$name" "${exits[*]}" "$props" "$steps" \
    "${secs[*]}" "$ok/$RUNS"
  [ "$ok" = "$RUNS" ] || bad=1
}
for p in "${PATCHES[@]}"; do
  name=$(basename "$p" .patch)
  src=$(branch "$name" "$p") || exit 2
  read -r -a args <<<"$(sed -n 's/^# gate-args: //p' "$p" | head -1)"
  row "$name" "$src" "$(protects "$p")" "${args[@]}"
done
[ $NOCLEAN = 1 ] || row "(unmodified)" "$(branch clean)" clean
echo "logs: $LOGS/"
exit $bad
