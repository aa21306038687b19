# pagedkv's OpenAI-compatible server as a container image.
#
#   docker build -t pagedkv .                                   # CUDA image (sm_80 + sm_90a)
#   docker build -t pagedkv --build-arg PAGEDKV_CUDA_ARCHS=90a \
#                --build-arg MAX_JOBS=16 --build-arg NVCC_THREADS=4 .
#   docker build -t pagedkv:cpu --target cpu .                  # CPU-only image
#   docker run --gpus all --ipc=host -p 8000:8000 \
#       -v ~/.cache/huggingface:/home/pagedkv/.cache/huggingface pagedkv [MODEL] [serve flags]
#
# Dependencies are installed by scripts/install_deps.py, the script CI runs (scripts/test.sh),
# so the image and CI cannot disagree on them. The wheel is built in a devel stage and installed
# into a runtime stage without compilers.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu24.04

# ---- CUDA build stage: the wheel, kernels for PAGEDKV_CUDA_ARCHS ---------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
# CUDA architectures (CMake syntax): "90a" for H100/H200 only builds several times faster.
ARG PAGEDKV_CUDA_ARCHS="80;90a"
# Parallel compile jobs (CMAKE_BUILD_PARALLEL_LEVEL) and nvcc's threads per job (--threads):
# memory grows with MAX_JOBS x NVCC_THREADS, about 2-4 GB per nvcc thread on the Hopper kernels.
ARG MAX_JOBS=4
ARG NVCC_THREADS=2
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
       build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY scripts/install_deps.py scripts/install_deps.py
RUN python scripts/install_deps.py --build-only
COPY . .
ENV PAGEDKV_CUDA=ON \
    PAGEDKV_CUDA_ARCHS=${PAGEDKV_CUDA_ARCHS} \
    CMAKE_BUILD_PARALLEL_LEVEL=${MAX_JOBS} \
    CUDAFLAGS="--threads ${NVCC_THREADS}"
RUN pip wheel -v --no-build-isolation --no-deps -w /wheels .

# ---- CPU-only build stage ------------------------------------------------------------------
FROM python:3.12-slim AS cpu-build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake ninja-build \
    && rm -rf /var/lib/apt/lists/*
ARG MAX_JOBS=4
WORKDIR /src
COPY scripts/install_deps.py scripts/install_deps.py
RUN python scripts/install_deps.py --build-only
COPY . .
ENV PAGEDKV_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=${MAX_JOBS}
RUN pip wheel -v --no-build-isolation --no-deps -w /wheels .

# ---- CPU-only image ------------------------------------------------------------------------
FROM python:3.12-slim AS cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY scripts/install_deps.py /tmp/install_deps.py
# torch's CPU wheel (the pinned version, without the CUDA libraries) from PyTorch's index.
RUN PIP_INDEX_URL=https://download.pytorch.org/whl/cpu PIP_EXTRA_INDEX_URL=https://pypi.org/simple \
    python /tmp/install_deps.py && rm /tmp/install_deps.py && rm -rf /root/.cache/pip
COPY --from=cpu-build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
RUN useradd --create-home --uid 1000 pagedkv
USER 1000:1000
ENV HF_HOME=/home/pagedkv/.cache/huggingface
RUN mkdir -p "$HF_HOME"
VOLUME ["/home/pagedkv/.cache/huggingface"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["pagedkv", "serve"]

# ---- CUDA runtime image: the default target (the last stage) ------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU} AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# The engine and server dependencies and the default model, by the script CI runs.
COPY scripts/install_deps.py /tmp/install_deps.py
RUN python /tmp/install_deps.py && rm /tmp/install_deps.py && rm -rf /root/.cache/pip
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
# Unprivileged user; models downloaded from the Hugging Face Hub go to a volume.
RUN useradd --create-home --uid 1000 pagedkv
USER 1000:1000
ENV HF_HOME=/home/pagedkv/.cache/huggingface
RUN mkdir -p "$HF_HOME"
VOLUME ["/home/pagedkv/.cache/huggingface"]
EXPOSE 8000
# Loading a large model takes minutes: start-period covers it. Draining (SIGTERM) answers 503.
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["pagedkv", "serve"]
