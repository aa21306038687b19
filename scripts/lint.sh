#!/usr/bin/env bash
# The style and type checks, one place for all of them: pre-commit's hooks and .ci/run call this
# script, so a commit, CI and the Docker build reach the same verdict with the same pinned tools
# (scripts/install_deps.py --lint). Any failing check fails the script.
#
#   bash scripts/lint.sh              every check
#   bash scripts/lint.sh ruff mypy    only those (ruff, format, clang-format, mypy, docker, k8s)
#   INSTALL=0 bash scripts/lint.sh    skip installing missing tools (pre-commit sets this)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

PY_DIRS=(python tests benchmarks scripts)

check_ruff() { "$PY" -m ruff check "${PY_DIRS[@]}"; }

check_format() { "$PY" -m ruff format --check "${PY_DIRS[@]}"; }

check_clang_format() {
  git ls-files -z '*.h' '*.cpp' '*.cu' '*.cuh' | xargs -0 clang-format --dry-run --Werror
}

# mypy reads pagedkv._C's types from the stubs the build generates next to the extension; a dev
# build copies them into python/pagedkv (git-ignored), a pip build leaves them in its build folder.
check_mypy() {
  local stub=python/pagedkv/_C.pyi
  if [ ! -e "$stub" ]; then
    local built
    built=$(ls -t build/*/src/python/_C.pyi 2>/dev/null | head -1 || true)
    if [ -z "$built" ]; then
      echo "mypy: no pagedkv._C stubs: build first (bash scripts/test.sh or pip install .)" >&2
      return 1
    fi
    cp "$built" "$stub"
  fi
  "$PY" -m mypy  # files and options: [tool.mypy] in pyproject.toml
}

check_docker() { hadolint Dockerfile; }

check_k8s() { kubernetes-validate --strict deploy/kubernetes/*.yaml; }

ALL=(ruff format clang-format mypy docker k8s)
checks=("$@")
[ ${#checks[@]} -eq 0 ] && checks=("${ALL[@]}")

if [ "${INSTALL:-1}" = 1 ]; then
  "$PY" scripts/install_deps.py --lint
fi

failed=()
for c in "${checks[@]}"; do
  case "$c" in
    ruff | format | clang-format | mypy | docker | k8s) ;;
    *) echo "lint.sh: unknown check '$c' (known: ${ALL[*]})" >&2; exit 2 ;;
  esac
  echo "== lint: $c =="
  if ! "check_${c//-/_}"; then failed+=("$c"); fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "lint.sh: failed: ${failed[*]}" >&2
  exit 1
fi
echo "lint.sh: all passed (${checks[*]})"
