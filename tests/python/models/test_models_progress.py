"""Progress bars follow the "pagedkv" logging level and never glue a log line onto their own.

Before: the "Loading GGUF tensors" bar showed with PAGEDKV_LOGGING_LEVEL=WARNING, and in a log
file (stderr not a terminal) the next log line was written on the bar's line.
"""

from __future__ import annotations

import io
import logging

import pytest
from support.deps import need

need("tqdm")

from pagedkv.models import loader  # noqa: E402
from pagedkv.models.progress import progress_bar  # noqa: E402


class FakeStderr(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def stderr(monkeypatch):
    """A non-terminal buffer that the "pagedkv" log lines go to; a test makes it sys.stderr in
    its body (pytest's output capture resets sys.stderr between setup and call)."""
    fake = FakeStderr(tty=False)
    monkeypatch.delenv("PAGEDKV_NO_PROGRESS", raising=False)
    log = logging.getLogger("pagedkv")
    handler = logging.StreamHandler(fake)
    handler.setFormatter(logging.Formatter("%(levelname)s pagedkv: %(message)s"))
    saved = (log.level, log.handlers[:], log.propagate)
    log.handlers[:] = [handler]
    log.propagate = False
    yield fake
    log.setLevel(saved[0])
    log.handlers[:] = saved[1]
    log.propagate = saved[2]


def _load(n: int) -> list:
    weights = ((f"w{i}", i) for i in range(n))
    return list(loader._progress(weights, n, "Loading GGUF tensors (dequantizing)"))


def test_bars_hidden_above_info(monkeypatch, stderr):
    monkeypatch.setattr("sys.stderr", stderr)
    logging.getLogger("pagedkv").setLevel(logging.WARNING)
    assert _load(5) == [(f"w{i}", i) for i in range(5)]
    assert progress_bar(total=3, desc="Processed prompts") is None
    logging.getLogger("pagedkv").warning("only this")
    assert stderr.getvalue() == "WARNING pagedkv: only this\n"


def test_bar_in_a_log_file_ends_its_line(monkeypatch, stderr):
    monkeypatch.setattr("sys.stderr", stderr)
    log = logging.getLogger("pagedkv")
    log.setLevel(logging.INFO)
    assert _load(7) == [(f"w{i}", i) for i in range(7)]
    log.info("model loaded")
    text = stderr.getvalue()
    assert "Loading GGUF tensors (dequantizing)" in text and "7/7" in text
    # The log line starts a line of its own, right after the bar's final state.
    lines = text.split("\n")
    assert "INFO pagedkv: model loaded" in lines and lines[-1] == ""
    assert "7/7" in lines[lines.index("INFO pagedkv: model loaded") - 1]


def test_transient_bar_erases_itself_on_a_terminal(monkeypatch, stderr):
    tty = FakeStderr(tty=True)
    monkeypatch.setattr("sys.stderr", tty)
    logging.getLogger("pagedkv").setLevel(logging.DEBUG)
    bar = progress_bar(range(3), total=3, desc="Loading", transient=True)
    assert bar is not None and list(bar) == [0, 1, 2]
    assert not tty.getvalue().endswith("\n")  # erased, nothing left for the next line
    kept = progress_bar(total=2, desc="Processed prompts")
    kept.update(2)
    kept.close()
    assert tty.getvalue().endswith("\n")  # LLM.generate's bar stays, as vLLM's does
    monkeypatch.setenv("PAGEDKV_NO_PROGRESS", "1")
    assert progress_bar(total=1, desc="x") is None
