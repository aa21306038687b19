"""Server-side request limits that protect the process and the other requests, named after
vLLM's ``--max-*`` options.

``n`` (choices per prompt): every choice is a sequence with its own state in the engine, so a
single request with an enormous ``n`` can exhaust the server's host memory before it runs. vLLM
caps it with ``$VLLM_MAX_N_SEQUENCES`` (default 16384); pagedkv reads
``$PAGEDKV_MAX_N_SEQUENCES`` (else vLLM's variable) with the same default, and a request over
it gets a 400 naming ``n``. An app built by ``build_app(engine, args)`` takes
``args.max_n_sequences`` first.

The list fields and strings every step works through (stop strings are searched in the new
text, bad words matched against the output, logit_bias added to the logits) are bounded by
``--max-stop-strings``, ``--max-bad-words``, ``--max-word-chars`` and ``--max-logit-bias``
(400 naming the field), and every request body by ``--max-request-body-size`` (413), /tokenize
and /detokenize included. One image of a request (``image_url``) may have at most
``--max-image-pixels`` pixels, read from its header before it is decoded (400 naming the part).
The defaults are far above what OpenAI allows (4 stop strings, 300
logit_bias entries), so that ordinary vLLM clients are not refused.
"""

from __future__ import annotations

from typing import Any, Dict

from pagedkv.engine.input_processor import (  # noqa: F401 - the limit's names, re-exported
    DEFAULT_MAX_N_SEQUENCES,
    MAX_N_ENV,
    RequestLimits,
    max_n_sequences_from_env,
)

# Flag dest -> default (serve.py's DEFAULTS include these; build_app reads them from args).
LIMIT_DEFAULTS: Dict[str, int] = {
    "max_stop_strings": 64,
    "max_bad_words": 256,
    "max_word_chars": 1024,
    "max_logit_bias": 1024,
    "max_request_body_size": 16 * 2**20,  # bytes
    # One image's width x height, checked from its header before it decodes: an 8000 x 8000
    # PNG of a few kilobytes took 11 s to decode on the tokenizer thread. 4096 x 4096 is
    # above every supported vision processor's input (they resize to about 1-3 Mpx).
    "max_image_pixels": 4096 * 4096,
}


def max_n_sequences(args: Any = None) -> int:
    """The `n` limit: ``args.max_n_sequences`` when set, else the environment's (the engine's
    rule, input_processor.max_n_sequences_from_env)."""
    return max_n_sequences_from_env(getattr(args, "max_n_sequences", None))


def limit_of(args: Any, name: str) -> int:
    """``args.<name>`` when set, else its default (LIMIT_DEFAULTS)."""
    value = getattr(args, name, None)
    return LIMIT_DEFAULTS[name] if value is None else int(value)


def request_limits(args: Any = None) -> RequestLimits:
    """The InputProcessor limits of a server started with ``args``."""
    return RequestLimits(
        max_n_sequences=max_n_sequences(args),
        **{
            k: limit_of(args, k)
            for k in (
                "max_stop_strings",
                "max_bad_words",
                "max_word_chars",
                "max_logit_bias",
                "max_image_pixels",
            )
        },
        source="the server (--max-stop-strings, --max-bad-words, --max-word-chars, "
        "--max-logit-bias, --max-image-pixels)",
    )
