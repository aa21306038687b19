"""SpeculativeConfig: vLLM's ``speculative_config`` dict, checked once at engine start.

Two methods run here: n-gram prompt lookup (``method: "ngram"``) and a draft model
(``model: <folder or hub id>``; ``method: "draft_model"``, inferred from ``model`` as vLLM does).
Every other method (EAGLE, Medusa, MLP speculators) and every key pagedkv does not honour is
refused by name, never accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

NGRAM, DRAFT_MODEL = "ngram", "draft_model"

# vLLM's keys that pagedkv honours, per method. Of prompt_lookup_min / prompt_lookup_max one is
# needed; a missing one takes the other's value. A draft model is loaded like the target (same
# dtype and device), from its own revision / quantization when given.
_NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
_DRAFT_KEYS = ("model", "revision", "quantization", "draft_tensor_parallel_size")
_HONOURED = ("method", "num_speculative_tokens") + _NGRAM_KEYS + _DRAFT_KEYS
# vLLM keys whose given value changes nothing here (their vLLM defaults).
_HARMLESS: Dict[str, tuple] = {
    "disable_by_batch_size": (None,),
    "disable_logprobs": (None, True),
    "draft_tensor_parallel_size": (None, 1),
}
# vLLM keys of draft models that pagedkv does not support (any value but None is refused).
_UNSUPPORTED_DRAFT_KEYS = ("max_model_len", "code_revision", "speculative_token_tree")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str  # NGRAM or DRAFT_MODEL
    num_speculative_tokens: int
    prompt_lookup_min: int = 0  # (ngram only)
    prompt_lookup_max: int = 0
    model: Optional[str] = None  # (draft_model only) the draft checkpoint
    revision: Optional[str] = None
    quantization: Optional[str] = None

    @classmethod
    def from_dict(cls, raw: Optional[Mapping[str, Any]]) -> Optional[SpeculativeConfig]:
        """None for None / {}; ValueError naming the key for anything not supported."""
        if raw is None or (isinstance(raw, Mapping) and not raw):
            return None
        if not isinstance(raw, Mapping):
            raise TypeError(
                f"speculative_config must be a dict (vLLM's keys), got {type(raw).__name__}"
            )
        d = dict(raw)
        for key in _UNSUPPORTED_DRAFT_KEYS:
            if d.get(key) is not None:
                raise ValueError(
                    f"speculative_config[{key!r}] is not supported for draft models (the draft "
                    "runs with the target's max_model_len)"
                )
        for key, ok in _HARMLESS.items():
            if key in d and not any(d[key] is v or d[key] == v for v in ok):
                raise ValueError(
                    f"speculative_config[{key!r}]={d[key]!r} is not supported (accepted: "
                    f"{', '.join(map(repr, ok))})"
                )
        unknown = sorted(set(d) - set(_HONOURED) - set(_HARMLESS) - set(_UNSUPPORTED_DRAFT_KEYS))
        if unknown:
            raise ValueError(
                f"speculative_config: unsupported key(s) {', '.join(map(repr, unknown))}; "
                f"pagedkv takes {', '.join(_HONOURED)}"
            )
        method = d.get("method")
        if method is None:
            method = _inferred_method(d.get("model"))
            if method not in (NGRAM, DRAFT_MODEL):
                raise ValueError(
                    f"speculative_config['model']={d['model']!r} names a speculator head, for "
                    f"which vLLM infers method {method!r}: {method!r} is not supported; set "
                    "'method': 'draft_model' if it is a complete model"
                )
        if method not in (NGRAM, DRAFT_MODEL):
            raise ValueError(
                f"speculative_config['method']={method!r} is not supported: pagedkv runs "
                f"{NGRAM!r} (prompt lookup) and {DRAFT_MODEL!r} (a draft model, 'model')"
            )
        k = _positive_int("num_speculative_tokens", d.get("num_speculative_tokens"))
        if method == DRAFT_MODEL:
            return cls._draft_model(d, k)
        return cls._ngram(d, k)

    @classmethod
    def _ngram(cls, d: Dict[str, Any], k: int) -> SpeculativeConfig:
        for key in _DRAFT_KEYS:
            if d.get(key) is not None and key not in _HARMLESS:
                raise ValueError(
                    f"speculative_config[{key!r}] is a draft model's key; method 'ngram' "
                    "takes none (leave 'method' out or set it to 'draft_model')"
                )
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        if lo is None and hi is None:
            raise ValueError(
                "speculative_config: method 'ngram' needs prompt_lookup_max (and optionally "
                "prompt_lookup_min)"
            )
        lo = _positive_int("prompt_lookup_min", hi if lo is None else lo)
        hi = _positive_int("prompt_lookup_max", lo if hi is None else hi)
        if lo > hi:
            raise ValueError(
                f"speculative_config: prompt_lookup_min ({lo}) must not exceed "
                f"prompt_lookup_max ({hi})"
            )
        return cls(NGRAM, k, lo, hi)

    @classmethod
    def _draft_model(cls, d: Dict[str, Any], k: int) -> SpeculativeConfig:
        for key in _NGRAM_KEYS:
            if d.get(key) is not None:
                raise ValueError(
                    f"speculative_config[{key!r}] applies to method 'ngram' only, not to a "
                    "draft model"
                )
        model = d.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError(
                "speculative_config: method 'draft_model' needs 'model' (a checkpoint folder or "
                f"hub id), got {model!r}"
            )
        for key in ("revision", "quantization"):
            if d.get(key) is not None and not isinstance(d[key], str):
                raise TypeError(f"speculative_config[{key!r}] must be a str, got {d[key]!r}")
        return cls(
            DRAFT_MODEL,
            k,
            model=model,
            revision=d.get("revision"),
            quantization=d.get("quantization"),
        )


def _inferred_method(model: Any) -> str:
    """vLLM's rule when 'method' is left out: from the draft's name (EAGLE, Medusa and MLP
    speculator heads by their names, else a draft model); no model: n-gram."""
    if model is None:
        return NGRAM
    name = str(model).lower()
    for part, method in (
        ("eagle3", "eagle3"),
        ("eagle", "eagle"),
        ("medusa", "medusa"),
        ("mlp_speculator", "mlp_speculator"),
    ):
        if part in name:
            return method
    return DRAFT_MODEL


def _positive_int(name: str, v: Any) -> int:
    if v is None:
        raise ValueError(f"speculative_config[{name!r}] is required")
    if type(v) is not int or v < 1:
        raise ValueError(f"speculative_config[{name!r}] must be an int >= 1, got {v!r}")
    return v
