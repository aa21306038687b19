#!/usr/bin/env bash
# Runs the test suite on a fresh machine: installs what is missing, builds the library with its
# GoogleTest suite and the Python extension in the build folder `pip install .` uses (so after the
# README's first command only the tests compile), runs ctest, then pytest.
#
#   bash scripts/test.sh          everything CI runs (about 30 min on 2 cores)
#   bash scripts/test.sh --fast   ctest + the pytest tests not marked slow
#
#   PAGEDKV_CUDA=OFF|ON|AUTO     build the CUDA kernels (default AUTO: when nvcc is found)
#   PAGEDKV_CUDA_ARCHS="90a"     restrict the CUDA architectures (default "80;90a")
#   PYTEST_ARGS="-k scheduler"   extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

fast=0
for arg in "$@"; do
  case "$arg" in
    --fast) fast=1 ;;
    -h | --help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

"$PY" scripts/install_deps.py --test

# GoogleTest comes from the system (this project builds offline: no FetchContent download).
# Debian/Ubuntu as root: installed here; elsewhere the C++ tests are skipped, loudly.
have_gtest() {
  local f
  for f in /usr/lib/*/cmake/GTest/GTestConfig.cmake /usr/lib/cmake/GTest/GTestConfig.cmake \
    /usr/local/lib/cmake/GTest/GTestConfig.cmake /usr/lib/*/libgtest.a /usr/lib/libgtest.a; do
    [ -e "$f" ] && return 0
  done
  return 1
}
if ! have_gtest && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing GoogleTest (apt-get install libgtest-dev) =="
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q libgtest-dev || true
fi
cpp_tests=OFF
if have_gtest; then
  cpp_tests=ON
else
  echo "!! GoogleTest not found (installing it needs root and apt-get): the C++ tests" >&2
  echo "!! (ctest) are SKIPPED; pytest still runs. Install libgtest-dev (or GTest's CMake" >&2
  echo "!! package) to run them." >&2
fi

# pip -v shows the build's progress (ninja's [n/N] lines) instead of minutes of silence; the
# whole log stays in build/test-build.log.
echo "== build (incremental, in the folder pip install . uses) =="
mkdir -p build
log=build/test-build.log
set +e
PAGEDKV_BUILD_TESTS=$cpp_tests "$PY" -m pip install -v --no-build-isolation --no-deps \
  -Ccmake.define.PAGEDKV_BUILD_TESTS=$cpp_tests . 2>&1 | tee "$log" |
  grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] |^-- Build files|Successfully installed'
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  tail -n 60 "$log"
  echo "test.sh: the build failed (full log: $log)" >&2
  exit "$status"
fi

if [ $cpp_tests = ON ]; then
  build_dir=$(sed -n 's/.*Build files have been written to: //p' "$log" | tail -1)
  echo "== ctest ($build_dir) =="
  ctest --test-dir "$build_dir" --output-on-failure -j 2 --no-tests=error
fi

echo "== pytest$([ $fast = 1 ] && echo ' (--fast: not slow)') =="
marker=()
[ $fast = 1 ] && marker=(-m "not slow")
# Exit code 5 ("no tests collected") is a failure here, as is any other non-zero code.
"$PY" -m pytest tests/python "${marker[@]}" ${PYTEST_ARGS:-}
