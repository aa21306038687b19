#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what is missing, builds the library
# with its GoogleTest suite and the Python extension in one CMake build, runs ctest, then pytest.
#
#   PAGEDKV_CUDA=OFF|ON|AUTO     build the CUDA kernels (default AUTO: when nvcc is found)
#   PAGEDKV_CUDA_ARCHS="90a"     restrict the CUDA architectures (default "80;90a")
#   PYTEST_ARGS="-k scheduler"   extra pytest arguments
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

"$PY" scripts/install_deps.py --test

build_dir=build/test
PAGEDKV_BUILD_TESTS=ON "$PY" -m pip install --no-build-isolation --no-deps -q \
  -Cbuild-dir="$build_dir" -Ccmake.define.PAGEDKV_BUILD_TESTS=ON .

echo "== ctest =="
ctest --test-dir "$build_dir" --output-on-failure -j 2 --no-tests=error

echo "== pytest =="
# Exit code 5 ("no tests collected") is a failure here, as is any other non-zero code.
"$PY" -m pytest tests/python ${PYTEST_ARGS:-}
