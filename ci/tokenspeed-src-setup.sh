#!/usr/bin/env bash
# The toolchain `--target tokenspeed --src CHECKOUT` builds TokenSpeed's scheduler with
# (caches/adapters/tokenspeed/build.py): cmake >= 3.22, ninja, a C++20 compiler and the OpenSSL
# headers (Debian packages, installed when missing and apt-get is usable), then the PyPI
# packages its CMakeLists imports through this Python: nanobind and tokenspeed-spdlog (pinned
# to what tokenspeed-scheduler's pyproject.toml requires).  Idempotent.  Not part of
# ci/setup.sh: the pinned wheel needs none of this, and a first build takes minutes.
#   PYTHON   the Python kvcheck runs with (default python3)
set -euo pipefail
PY=${PYTHON:-python3}
start=$(date +%s)
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v c++ >/dev/null || need+=(g++)
[ -f /usr/include/openssl/sha.h ] || need+=(libssl-dev)
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "install these system packages first (Debian names): ${need[*]}" >&2
    exit 1
  fi
fi
"$PY" -m pip install -q --disable-pip-version-check "nanobind>=2.13.0" "tokenspeed-spdlog==1.15.1"
echo "tokenspeed build toolchain ready in $(( $(date +%s) - start ))s: $(cmake --version | head -1)," \
     "$(c++ --version | head -1), nanobind $("$PY" -c 'import nanobind; print(nanobind.__version__)')"
