# Sourced first by every GPU session call (benchmarks/gpu_session.sh sources the copy that
# benchmarks/gpu_carry.sh puts in .whl/, so an older checkout's session still finds it):
#  * installs into /tmp/site the carried wheels (.whl/*.whl) whose package the image lacks or
#    has at an older version; the image's own packages stay as they are (no --upgrade of torch
#    & co. by a dependency: --no-deps). On a warm machine the second call installs nothing.
#  * exports PYTHONPATH=/tmp/site, the settings of the CUDA build (sm_90a), and the variables
#    that keep NVLink multicast off (a program using it can take the host's shared GPUs out of
#    service: /work/.library/device/KINDS.md) and make a stuck NCCL collective an error.
#   source .whl/gpu_env.sh
WHL_DIR=${WHL_DIR:-.whl}
mkdir -p /tmp/site
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
mapfile -t _need < <(timeout 60 python3 - "$WHL_DIR" <<'PY'
import glob
import sys
from importlib.metadata import PackageNotFoundError, version

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

for path in sorted(glob.glob(sys.argv[1] + "/*.whl")):
    name, ver, _, _ = parse_wheel_filename(path.rsplit("/", 1)[-1])
    try:
        have = Version(version(canonicalize_name(name)))
    except PackageNotFoundError:
        have = None
    if have is None or have < ver:
        print(path)
PY
)
echo "gpu_env: installing ${#_need[@]} wheel(s): ${_need[*]##*/}"
if [ ${#_need[@]} -gt 0 ]; then
  timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target /tmp/site "${_need[@]}" || echo "gpu_env: wheel install FAILED"
fi
unset _need
export PAGEDKV_CUDA=ON PAGEDKV_CUDA_ARCHS=90a CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-32}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=60 NCCL_TIMEOUT=60
export PYTHONUNBUFFERED=1
export PAGEDKV_TEST_TOKENIZER=${PAGEDKV_TEST_TOKENIZER:-$PWD/$WHL_DIR/smollm2-tokenizer}  # random checkpoints
