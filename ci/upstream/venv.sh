# Shared by ci/upstream/setup.sh (SGLang) and ci/upstream/vllm-setup.sh (vLLM): build a pinned
# upstream virtualenv and put kvcheck into it.  Source it, then:
#   build_venv VENV LIST TORCH   # (re)build VENV from LIST (--no-deps) unless it was built from
#                                # exactly LIST, TORCH and this Python; never a CUDA torch
#   install_kvcheck VENV         # kvcheck from this checkout, editable, without dependencies
# Both exit the script with a message on failure.

build_venv() {
  local venv=$1 list=$2 torch=$3 stamp
  stamp="$(sha256sum "$list" | cut -d' ' -f1) $torch $(${PYTHON:-python3} -c 'import sys; print(sys.version.split()[0])')"
  if [ -f "$venv/.kvcheck-upstream" ] && [ "$(cat "$venv/.kvcheck-upstream")" = "$stamp" ]; then
    echo "upstream env $venv is up to date ($list unchanged)"
    return 0
  fi
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ]; then
    echo "$venv exists and is not a virtualenv; not touching it (set UPSTREAM_VENV)" >&2; exit 1
  fi
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  _venv_pip "$venv" "$torch"
  _venv_pip "$venv" --no-deps -r "$list"
  # what must never happen: a CUDA torch or a real torchvision sneaking in
  "$venv/bin/python" - <<'PY'
import importlib.util, torch
assert importlib.util.find_spec("torchvision") is None, "torchvision got installed"
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
PY
  echo "$stamp" > "$venv/.kvcheck-upstream"
}

_venv_pip() {
  local venv=$1; shift
  if ! "$venv/bin/python" -m pip install -q "$@" > "$venv/pip.log" 2>&1; then
    grep -v "is ignored: it is neither" "$venv/pip.log" >&2; echo "pip install $* failed" >&2
    exit 1
  fi
}

install_kvcheck() {
  local venv=$1
  # kvcheck's own targets register through the entry-point group kvcheck.targets exactly as a
  # plug-in's do (pyproject.toml); re-done on every run, so a venv follows its checkout
  rm -f "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/kvcheck-checkout.pth"
  if ! "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e . > "$venv/pip-kvcheck.log" 2>&1; then
    cat "$venv/pip-kvcheck.log" >&2; echo "installing kvcheck into $venv failed" >&2; exit 1
  fi
}
