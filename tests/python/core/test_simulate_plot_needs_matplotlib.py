"""`pagedkv simulate --plot` without matplotlib: a usage error naming the flag and the fix,
before the simulation runs (not a ModuleNotFoundError traceback at the end)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pagedkv.entrypoints.cli import main

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "traces" / "sample.jsonl"


def test_plot_without_matplotlib_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    png = tmp_path / "sim.png"
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(SAMPLE), "--num-blocks", "512", "--plot", str(png)])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert "argument --plot: needs matplotlib" in captured.err
    assert "pip install matplotlib" in captured.err
    assert "requests" not in captured.out, "refused before simulating"
    assert not png.exists()
