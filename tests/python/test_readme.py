"""The README's examples are run as written: its Python blocks execute in a fresh interpreter,
and its Quickstart holds exactly the two commands (main job, test suite) that CI relies on."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_quickstart_has_the_two_commands() -> None:
    quick = README[README.index("## Quickstart") :]
    quick = quick[: quick.index("\n## ", 1)]
    commands = [
        ln
        for b in re.findall(r"```bash\n(.*?)```", quick, re.S)
        for ln in b.splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert commands == [
        "python3 scripts/install_deps.py && pip install -v --no-build-isolation . && "
        'pagedkv generate "The capital of France is"',
        "bash scripts/test.sh",
    ]
    ci = (Path(__file__).resolve().parents[2] / ".ci" / "run").read_text()
    assert "bash scripts/test.sh" in ci


def test_core_example_runs() -> None:
    core = next(b for b in _blocks("python") if "Scheduler" in b)
    out = subprocess.run([sys.executable, "-c", core], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "['req-0', 'req-1'] 512 [484  28]" in out.stdout
    assert "Tensor (2, 8, 128)" in out.stdout


@pytest.mark.slow
def test_engine_example_runs() -> None:
    engine = next(b for b in _blocks("python") if "LLM()" in b)
    out = subprocess.run(
        [sys.executable, "-c", engine], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # repr() quotes a text holding an apostrophe with double quotes: either quote is fine.
    assert (
        lines[0].startswith(("'The capital of France is' -> '", "'The capital of France is' -> \""))
        and len(lines[0]) > 40
    )
    assert (
        lines[1].startswith(("'def fibonacci(n):' -> '", "'def fibonacci(n):' -> \""))
        and len(lines[1]) > 30
    )
    assert len(" ".join(lines[2:]).split()) >= 5  # a chat reply of several words
