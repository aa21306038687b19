#!/usr/bin/env bash
# The Dockerfile's CPU image, without Docker: its install steps, in the same order and through
# the same script (scripts/install_deps.py), run in a fresh virtual environment, then the image's
# entrypoint (`pagedkv serve`) is started, probed on /health and stopped with SIGTERM, which
# must drain and exit 0. CI runs this (.ci/run), so the image's steps cannot rot unnoticed on
# machines without Docker. The wheel is built in pip's usual build folder (incremental after
# `pip install .` or scripts/test.sh).
#
#   bash scripts/image_steps.sh            (VENV=/path to keep the environment elsewhere)
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYTHONPATH  # the installed package, not a source tree, must answer
venv=$(realpath -m "${VENV:-build/image-venv}")
rm -rf "$venv" build/image-wheels
"${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"

echo "== image steps: build stage =="
"$py" scripts/install_deps.py --build-only
PAGEDKV_CUDA=OFF "$py" -m pip wheel -v --no-build-isolation --no-deps -w build/image-wheels . 2>&1 |
  grep -E '^ *\[[0-9]+/[0-9]+\] |Successfully built' || true
ls build/image-wheels/pagedkv-*.whl >/dev/null  # the wheel exists, or the build failed

echo "== image steps: runtime stage =="
"$py" scripts/install_deps.py
"$py" -m pip install --no-deps build/image-wheels/pagedkv-*.whl

echo "== image entrypoint: pagedkv serve, /health, SIGTERM =="
port=$("$py" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=build/image-serve.log
"$venv/bin/pagedkv" serve smollm2 --host 127.0.0.1 --port "$port" --max-model-len 256 \
  --kv-cache-space 0.05 --shutdown-timeout 5 >"$log" 2>&1 &
pid=$!
healthy=0
for _ in $(seq 600); do  # up to 5 minutes for the model to load
  if "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null; then
    healthy=1
    break
  fi
  kill -0 "$pid" 2>/dev/null || { cat "$log"; echo "image_steps.sh: the server died" >&2; exit 1; }
  sleep 0.5
done
if [ $healthy != 1 ]; then
  kill -KILL "$pid"
  tail -n 40 "$log"
  echo "image_steps.sh: /health never answered 200" >&2
  exit 1
fi
kill -TERM "$pid"
status=0
wait "$pid" || status=$?
if [ "$status" != 0 ]; then
  tail -n 40 "$log"
  echo "image_steps.sh: pagedkv serve exited with $status after SIGTERM (want 0)" >&2
  exit 1
fi
echo "image_steps.sh: the image's steps install, serve and drain (exit 0)"
