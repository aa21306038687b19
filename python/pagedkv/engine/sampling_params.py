"""SamplingParams: how to pick tokens for one request, with vLLM's names and defaults.

Validation happens at construction; a value of the wrong type raises ``TypeError`` and a bad
value ``ValueError``, both naming the field, so that the server can turn them into an HTTP 400
without knowing the rules.
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

from pagedkv.engine.structured_output import GuidedDecodingParams, StructuredOutputsParams

# Below this temperature sampling is greedy (vLLM uses the same threshold).
_GREEDY_EPS = 1e-5

# Field types, checked before the value rules (numpy scalars pass and become Python numbers).
_INT_FIELDS = ("n", "top_k", "min_tokens")
_OPTIONAL_INT_FIELDS = (
    "best_of",
    "seed",
    "max_tokens",
    "logprobs",
    "prompt_logprobs",
    "truncate_prompt_tokens",
)
_FLOAT_FIELDS = (
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "temperature",
    "top_p",
    "min_p",
)
_BOOL_FIELDS = (
    "ignore_eos",
    "detokenize",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
)

# The sampler works in float32 and its tensors hold int64: a value outside these ranges would
# overflow there (top_k = 2**64: "Overflow when unpacking long long") or silently become inf /
# 0 (temperature 1e39, repetition_penalty 1e-46), turning every logit into NaN.
_INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.401298464324817e-45  # the smallest positive float32 (a subnormal)
# repetition_penalty divides or multiplies logits; within these bounds a logit (with a
# logit_bias of at most LOGIT_BIAS_MAX, then divided by a sampling temperature >= 1e-5) stays
# far inside float32's range, so no row of logits turns into inf / NaN.
REPETITION_PENALTY_RANGE = (1e-6, 1e6)
LOGIT_BIAS_MAX = 1e10


class RequestOutputKind(str, enum.Enum):
    """What each RequestOutput of a request carries (vLLM's enum, same member names). A str
    enum: ``SamplingParams(output_kind="delta")`` works too, and compares equal to its value."""

    CUMULATIVE = "cumulative"  # everything generated so far, at every step
    DELTA = "delta"  # only what is new since the request's previous output
    FINAL_ONLY = "final_only"  # one output, when the request finishes


def _shown(value: Any, limit: int = 80) -> str:
    """repr of a value, cut to ``limit`` characters: an error message must stay short when a
    request sends a huge list."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _type_error(name: str, want: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be {want}, got {type(value).__name__} {_shown(value)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _float32(name: str, v: float) -> float:
    """``v`` if float32 holds it (finite, not overflowing, not rounding to zero), else a
    ValueError naming the field."""
    if not math.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v!r}")
    if abs(v) > FLOAT32_MAX:
        raise ValueError(
            f"{name} must be at most {FLOAT32_MAX:.4g} in magnitude (float32's "
            f"range, which the sampler computes in), got {v!r}"
        )
    if v != 0.0 and abs(v) < FLOAT32_TINY:
        raise ValueError(
            f"{name} is too close to zero for float32 (which the sampler "
            f"computes in): {v!r} would become 0"
        )
    return v


@dataclass
class SamplingParams:
    n: int = 1
    best_of: Optional[int] = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    logprobs: Optional[int] = None
    prompt_logprobs: Optional[int] = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # CUMULATIVE: an output every step (streaming); DELTA: an output every step with only the
    # new text / token ids / logprobs; FINAL_ONLY: only when finished (LLM.generate uses it,
    # which also lets the engine decode the text once at the end). Strings are accepted.
    output_kind: Union[RequestOutputKind, str] = RequestOutputKind.CUMULATIVE
    # token id -> value added to its logit before sampling (vLLM's logit_bias; the OpenAI
    # server clamps values to [-100, 100] as OpenAI does, this class takes them as given).
    logit_bias: Optional[Dict[int, float]] = None
    # Keep only the last k prompt tokens (vLLM's left truncation); -1: as many as the model
    # takes (max_model_len - 1, leaving room for one generated token); None: no truncation.
    truncate_prompt_tokens: Optional[int] = None
    # Only these token ids can be sampled (vLLM's allowed_token_ids); None: any.
    allowed_token_ids: Optional[List[int]] = None
    # Words that must not be generated (vLLM's bad_words): each is tokenized as at the start of
    # the text and after a space; the last token of such a sequence is banned whenever the
    # output ends with the others.
    bad_words: Optional[List[str]] = None
    # Constrained decoding (xgrammar): a JSON schema, regex, choice list or grammar the output
    # must follow. guided_decoding is vLLM's older spelling, folded into structured_outputs.
    structured_outputs: Optional[StructuredOutputsParams] = None
    guided_decoding: Optional[GuidedDecodingParams] = None
    # vLLM's per-request logits processors: f(output_ids, logits) or f(prompt_ids, output_ids,
    # logits) -> logits, on each row of this request (offline API only: not serializable).
    logits_processors: Optional[List[Callable[..., Any]]] = None

    def __post_init__(self) -> None:
        if self.top_k is None:
            self.top_k = 0
        self._check_structured()
        self._check_types()
        self._check_logit_bias()
        if self.best_of is None:
            self.best_of = self.n
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop is not None else []
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
        if self.allowed_token_ids is not None:
            self.allowed_token_ids = [int(t) for t in self.allowed_token_ids]
        if self.bad_words is not None:
            self.bad_words = list(self.bad_words)
        if self.top_k == -1:
            self.top_k = 0  # vLLM spells "off" as -1 (older) or 0 (newer); keep one spelling
        self._verify()
        if self.temperature < _GREEDY_EPS:
            # Greedy: the truncation knobs cannot change an argmax, so drop them.
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0

    @property
    def sampling_type_greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def all_stop_token_ids(self) -> List[int]:
        return list(self.stop_token_ids or [])

    def _check_types(self) -> None:
        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if not _is_int(v):
                want = "an integer or None" if name in _OPTIONAL_INT_FIELDS else "an integer"
                raise _type_error(name, want, v)
            if not _INT64[0] <= v <= _INT64[1]:
                raise ValueError(
                    f"{name} must be in [-2**63, 2**63 - 1] (int64, as vLLM's "
                    f"server bounds seeds), got {v!r}"
                )
            setattr(self, name, int(v))
        for name in _FLOAT_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise _type_error(name, "a number", v)
            setattr(self, name, _float32(name, float(v)))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise _type_error(name, "True or False", getattr(self, name))
        stop = self.stop
        if (
            stop is not None
            and not isinstance(stop, str)
            and not (isinstance(stop, (list, tuple)) and all(isinstance(x, str) for x in stop))
        ):
            raise _type_error("stop", "a string or a list of strings", stop)
        for name in ("stop_token_ids", "allowed_token_ids"):
            ids = getattr(self, name)
            if ids is not None and not (
                isinstance(ids, (list, tuple)) and all(_is_int(t) for t in ids)
            ):
                raise _type_error(name, "a list of integer token ids", ids)
        words = self.bad_words
        if words is not None and not (
            isinstance(words, (list, tuple)) and all(isinstance(w, str) for w in words)
        ):
            raise _type_error("bad_words", "a list of strings", words)
        if not isinstance(self.output_kind, str):
            raise _type_error("output_kind", "a RequestOutputKind or a string", self.output_kind)

    def _verify(self) -> None:
        def bad(name: str, msg: str) -> ValueError:
            return ValueError(f"{name} {msg}, got {_shown(getattr(self, name))}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "must be an integer >= 1")
        if not isinstance(self.best_of, int) or self.best_of < self.n:
            raise bad("best_of", f"must be an integer >= n ({self.n})")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise bad(name, "must be in [-2, 2]")
        lo, hi = REPETITION_PENALTY_RANGE
        if not lo <= self.repetition_penalty <= hi:
            raise bad(
                "repetition_penalty",
                f"must be in [{lo:g}, {hi:g}] (> 0; the bounds keep "
                "penalised logits finite in float32)",
            )
        if not self.temperature >= 0.0:
            raise bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise bad("top_k", "must be -1 or 0 (disabled) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "must be in [0, 1]")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            raise bad("max_tokens", "must be an integer >= 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad("min_tokens", f"must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise bad("logprobs", "must be an integer >= 0")
        if self.prompt_logprobs is not None and (
            not isinstance(self.prompt_logprobs, int) or self.prompt_logprobs < 0
        ):
            raise bad("prompt_logprobs", "must be an integer >= 0")
        if any(not isinstance(s, str) or not s for s in self.stop):  # type: ignore[union-attr]
            raise bad("stop", "must be a non-empty string or a list of non-empty strings")
        if self.stop and not self.detokenize:  # stop strings are found in the text
            raise bad(
                "stop",
                "strings are only supported when detokenize is True (vLLM's "
                "rule); set detokenize=True to use stop",
            )
        if any(t < 0 for t in self.stop_token_ids):  # type: ignore[union-attr]
            raise bad("stop_token_ids", "must be non-negative token ids")
        if self.allowed_token_ids is not None and (
            not self.allowed_token_ids or any(t < 0 for t in self.allowed_token_ids)
        ):
            raise bad("allowed_token_ids", "must be a non-empty list of non-negative token ids")
        try:
            self.output_kind = RequestOutputKind(self.output_kind)
        except ValueError:
            raise bad(
                "output_kind",
                "must be a RequestOutputKind or one of 'cumulative', 'delta', 'final_only'",
            ) from None
        k = self.truncate_prompt_tokens
        if k is not None and (k == 0 or k < -1):
            raise bad("truncate_prompt_tokens", "must be an integer >= 1 or -1")
        if self.best_of > self.n and self.sampling_type_greedy:
            raise bad("best_of", "must equal n for greedy sampling (all sequences would match)")

    def _check_structured(self) -> None:
        so, gd = self.structured_outputs, self.guided_decoding
        if so is not None and not isinstance(so, StructuredOutputsParams):
            raise _type_error("structured_outputs", "a StructuredOutputsParams", so)
        if gd is not None:
            if not isinstance(gd, GuidedDecodingParams):
                raise _type_error("guided_decoding", "a GuidedDecodingParams", gd)
            if so is not None:
                raise ValueError(
                    "guided_decoding and structured_outputs are two spellings of "
                    "one field; set only structured_outputs"
                )
            self.structured_outputs, self.guided_decoding = gd.to_structured(), None
        lps = self.logits_processors
        if lps is not None and not (
            isinstance(lps, (list, tuple)) and all(callable(f) for f in lps)
        ):
            raise _type_error("logits_processors", "a list of callables", lps)
        if lps is not None:
            self.logits_processors = list(lps)

    def _check_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, dict) or not all(
            _is_int(t) and isinstance(v, numbers.Real) and not isinstance(v, bool)
            for t, v in bias.items()
        ):
            raise _type_error("logit_bias", "a dict of integer token ids to numbers", bias)
        self.logit_bias = {int(t): float(v) for t, v in bias.items()}
        if any(t < 0 for t in self.logit_bias):
            raise ValueError(f"logit_bias has out-of-vocab (negative) token ids: {_shown(bias)}")
        if not all(math.isfinite(v) for v in self.logit_bias.values()):
            raise ValueError(f"logit_bias values must be finite, got {_shown(bias)}")
        if any(abs(v) > LOGIT_BIAS_MAX for v in self.logit_bias.values()):
            raise ValueError(
                f"logit_bias values must be in [-{LOGIT_BIAS_MAX:g}, "
                f"{LOGIT_BIAS_MAX:g}] (logits stay finite in float32), got "
                f"{_shown(bias)}"
            )

    def clone(self) -> SamplingParams:
        import copy

        # Logits processors may hold state or models: shared, not copied (as in vLLM).
        memo = {id(f): f for f in self.logits_processors or ()}
        return copy.deepcopy(self, memo)
