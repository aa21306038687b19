"""The Dockerfile and the Kubernetes manifests against the code they deploy: the image installs
its dependencies only through scripts/install_deps.py (the script CI runs, so the two cannot
drift), and every `pagedkv serve` command line in them is accepted by the real argument parser.
(hadolint and kubernetes-validate check the files' own syntax: scripts/lint.sh.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Iterator, List

import pytest
from pagedkv.entrypoints.cli import build_parser
from support.deps import need

yaml = need("yaml")

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))


def _instructions(text: str) -> List[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def _serve_args(argv: List[str]) -> None:
    """Parses `pagedkv serve ARGS` as the CLI does (argparse exits 2 on a bad flag)."""
    args = build_parser().parse_args(["serve", *argv])
    assert args.command == "serve"


def test_python_dependencies_come_from_install_deps_only() -> None:
    pip_runs = [i for i in _instructions(DOCKERFILE) if i.startswith("RUN") and "pip " in i]
    assert pip_runs
    for run in pip_runs:
        wheel_step = ("pip wheel" in run or "/wheels/*.whl" in run) and "--no-deps" in run
        assert wheel_step, f"a pip step other than the wheel's own (use install_deps.py): {run}"
    deps = [i for i in _instructions(DOCKERFILE) if "install_deps.py" in i and i.startswith("RUN")]
    stages = [i for i in _instructions(DOCKERFILE) if i.startswith("FROM")]
    assert len(deps) == len(stages), "each stage installs through the script"


def test_image_serves_with_a_health_check_on_the_exposed_port() -> None:
    ins = _instructions(DOCKERFILE)
    assert ins[-1] == 'ENTRYPOINT ["pagedkv", "serve"]', "the default target is the CUDA image"
    assert 'ENTRYPOINT ["pagedkv", "serve"]' in ins
    for check in (i for i in ins if i.startswith("HEALTHCHECK")):
        assert "http://127.0.0.1:8000/health" in check
    assert "EXPOSE 8000" in ins
    assert any(i.startswith("USER 1000") for i in ins), "runs as a non-root user"


def _containers() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            spec = (doc or {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []):
                yield path.name, c


@pytest.mark.parametrize(
    "name,container", list(_containers()), ids=[f"{n}:{c['name']}" for n, c in _containers()]
)
def test_manifest_command_lines_parse(name: str, container: dict[str, Any]) -> None:
    if container.get("command"):  # a shell line: torchrun ... -m pagedkv serve ARGS
        words = shlex.split(container["args"][0].replace("\n", " "))
        assert words[:1] == ["exec"] and "torchrun" in words, words
        i = words.index("-m")
        assert words[i + 1 : i + 3] == ["pagedkv", "serve"], words
        _serve_args(words[i + 3 :])
    else:  # the image's entrypoint is `pagedkv serve`
        _serve_args(container["args"])
    env = {e["name"]: e for e in container.get("env", [])}
    assert "secretKeyRef" in env["PAGEDKV_API_KEY"]["valueFrom"], "the API key from a Secret"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in container:
            assert container[probe]["httpGet"]["path"] == "/health"
