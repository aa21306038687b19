"""SpeculativeConfig: vLLM's ``speculative_config`` dict, checked once at engine start.

Only n-gram prompt lookup (``method: "ngram"``) runs here; every other method (a draft model,
EAGLE, Medusa, MLP speculators) and every key pagedkv does not honour is refused by name, never
accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

# vLLM's keys that pagedkv honours. Of prompt_lookup_min / prompt_lookup_max one is needed; a
# missing one takes the other's value.
_HONOURED = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
# vLLM keys whose given value changes nothing here (their vLLM defaults).
_HARMLESS: Dict[str, tuple] = {
    "disable_by_batch_size": (None,),
    "disable_logprobs": (None, True),
}
_DRAFT_MODEL_KEYS = (
    "model",
    "draft_tensor_parallel_size",
    "quantization",
    "max_model_len",
    "revision",
    "code_revision",
    "speculative_token_tree",
)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

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
        for key in _DRAFT_MODEL_KEYS:
            if d.get(key) is not None:
                raise ValueError(
                    f"speculative_config[{key!r}]: draft-model speculation is not supported; "
                    "use method 'ngram' (prompt lookup)"
                )
        for key, ok in _HARMLESS.items():
            if key in d and not any(d[key] is v or d[key] == v for v in ok):
                raise ValueError(
                    f"speculative_config[{key!r}]={d[key]!r} is not supported (accepted: "
                    f"{', '.join(map(repr, ok))})"
                )
        unknown = sorted(set(d) - set(_HONOURED) - set(_HARMLESS) - set(_DRAFT_MODEL_KEYS))
        if unknown:
            raise ValueError(
                f"speculative_config: unsupported key(s) {', '.join(map(repr, unknown))}; "
                f"pagedkv takes {', '.join(_HONOURED)}"
            )
        method = d.get("method", "ngram")
        if method != "ngram":
            raise ValueError(
                f"speculative_config['method']={method!r} is not supported: only 'ngram' "
                "(prompt lookup) runs in pagedkv"
            )
        k = d.get("num_speculative_tokens")
        if k is None:
            raise ValueError("speculative_config['num_speculative_tokens'] is required")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        if lo is None and hi is None:
            raise ValueError(
                "speculative_config: method 'ngram' needs prompt_lookup_max (and optionally "
                "prompt_lookup_min)"
            )
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        k, lo, hi = (
            _positive_int(name, v)
            for name, v in (
                ("num_speculative_tokens", k),
                ("prompt_lookup_min", lo),
                ("prompt_lookup_max", hi),
            )
        )
        if lo > hi:
            raise ValueError(
                f"speculative_config: prompt_lookup_min ({lo}) must not exceed "
                f"prompt_lookup_max ({hi})"
            )
        return cls(method, k, lo, hi)


def _positive_int(name: str, v: Any) -> int:
    if type(v) is not int or v < 1:
        raise ValueError(f"speculative_config[{name!r}] must be an int >= 1, got {v!r}")
    return v
