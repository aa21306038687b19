"""Server-side request limits that protect the process itself, named after vLLM's.

``n`` (choices per prompt): every choice is a sequence with its own state in the engine, so a
single request with an enormous ``n`` can exhaust the server's host memory before it runs. vLLM
caps it with ``$VLLM_MAX_N_SEQUENCES`` (default 16384); pagedkv reads
``$PAGEDKV_MAX_N_SEQUENCES`` with the same default, and a request over it gets a 400 naming
``n``. An app built by ``build_app(engine, args)`` takes ``args.max_n_sequences`` first.
"""

from __future__ import annotations

import os
from typing import Any

MAX_N_ENV = "PAGEDKV_MAX_N_SEQUENCES"
DEFAULT_MAX_N_SEQUENCES = 16384  # vLLM's VLLM_MAX_N_SEQUENCES default


def max_n_sequences(args: Any = None) -> int:
    """The `n` limit: ``args.max_n_sequences`` when set, else $PAGEDKV_MAX_N_SEQUENCES, else
    16384. A value that is not an integer >= 1 is a configuration error (ValueError)."""
    value = getattr(args, "max_n_sequences", None)
    source = "max_n_sequences"
    if value is None and os.environ.get(MAX_N_ENV):
        value, source = os.environ[MAX_N_ENV], f"${MAX_N_ENV}"
    if value is None:
        return DEFAULT_MAX_N_SEQUENCES
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ValueError(f"{source} must be an integer >= 1, got {value!r}")
    return limit
