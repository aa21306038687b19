"""Progress bars (tqdm, on stderr) that behave like pagedkv's log lines.

Shared by the weight loader ("Loading GGUF tensors") and LLM.generate ("Processed prompts"):
- shown only while the "pagedkv" logger would print INFO (PAGEDKV_LOGGING_LEVEL=WARNING hides
  them with the INFO lines they sit among), never with PAGEDKV_NO_PROGRESS=1 or without tqdm;
- when stderr is not a terminal (a server's log file) a bar redraws rarely and always ends
  with a newline, so the next log line starts on a line of its own; on a terminal a transient
  bar erases itself when done.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Iterable, Optional


def progress_enabled() -> bool:
    if os.environ.get("PAGEDKV_NO_PROGRESS"):
        return False
    return logging.getLogger("pagedkv").isEnabledFor(logging.INFO)


def progress_bar(
    iterable: Optional[Iterable[Any]] = None,
    *,
    total: Optional[int],
    desc: str,
    unit: str = "it",
    transient: bool = False,
) -> Optional[Any]:
    """A tqdm bar, or None when bars are off (see the module docstring)."""
    if not progress_enabled():
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    tty = _stderr_is_tty()
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        dynamic_ncols=True,
        leave=not (transient and tty),
        mininterval=0.1 if tty else 10.0,
    )


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stream
        return False
