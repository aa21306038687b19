"""PoolingParams: what a pooling request (embed, classify, score, reward, encode) asks for.

vLLM's fields and rules: each task takes only the parameters that mean something for it
(``dimensions`` and ``normalize`` for embeddings, ``use_activation`` for class scores,
``step_tag_id`` / ``returned_token_ids`` for step rewards); a parameter of another task is
refused by name instead of being ignored. Values that need no model are checked here; the model's
side (Matryoshka dimensions, the task the engine serves) in :meth:`PoolingParams.verify`.
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

# The tasks a pooling request may run (vLLM's PoolingTask names) and the parameters each takes.
POOLING_TASKS = ("embed", "classify", "score", "reward", "encode")
_TASK_PARAMS: Dict[str, tuple[str, ...]] = {
    "embed": ("dimensions", "normalize"),
    "classify": ("use_activation",),
    "score": ("use_activation",),
    "reward": ("use_activation", "step_tag_id", "returned_token_ids"),
    "encode": ("normalize", "step_tag_id", "returned_token_ids"),
}
_OPTIONAL_FIELDS = (
    "dimensions",
    "normalize",
    "use_activation",
    "step_tag_id",
    "returned_token_ids",
)


def _is_int(v: Any) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


@dataclass
class PoolingParams:
    """vLLM's PoolingParams. ``activation`` and ``softmax`` are vLLM's older spellings of
    ``use_activation`` (folded into it). ``task`` is set by the LLM method or route (embed,
    classify, ...); ``output_kind`` is always final-only (a pooled output is one tensor)."""

    truncate_prompt_tokens: Optional[int] = None
    dimensions: Optional[int] = None
    normalize: Optional[bool] = None
    use_activation: Optional[bool] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None
    step_tag_id: Optional[int] = None
    returned_token_ids: Optional[List[int]] = None
    task: Optional[str] = None
    requires_token_ids: bool = False
    extra_kwargs: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        for old in ("activation", "softmax"):
            value = getattr(self, old)
            if value is not None:
                if self.use_activation is not None and self.use_activation != value:
                    raise ValueError(
                        f"{old}={value} contradicts use_activation={self.use_activation}"
                    )
                self.use_activation = value
                setattr(self, old, None)
        self._check_types()

    def _check_types(self) -> None:
        for name in ("normalize", "use_activation"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise TypeError(f"{name} must be True, False or None, got {type(v).__name__} {v!r}")
        for name in ("truncate_prompt_tokens", "dimensions", "step_tag_id"):
            v = getattr(self, name)
            if v is not None and not _is_int(v):
                raise TypeError(f"{name} must be an int or None, got {type(v).__name__} {v!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be >= 1, got {self.dimensions}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < -1:
            raise ValueError(
                f"truncate_prompt_tokens must be -1 (the model's limit) or >= 1, got "
                f"{self.truncate_prompt_tokens}"
            )
        if self.truncate_prompt_tokens == 0:
            raise ValueError("truncate_prompt_tokens must be -1 (the model's limit) or >= 1, got 0")
        ids = self.returned_token_ids
        if ids is not None:
            if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
                raise TypeError(f"returned_token_ids must be a list of ids >= 0, got {ids!r}")
            if not ids:
                raise ValueError("returned_token_ids must not be empty")
            self.returned_token_ids = [int(t) for t in ids]
        if self.task is not None and self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}")
        if not isinstance(self.requires_token_ids, bool):
            raise TypeError("requires_token_ids must be True or False")
        if self.extra_kwargs:
            raise ValueError(
                f"extra_kwargs {sorted(self.extra_kwargs)} are not supported: pagedkv's poolers "
                "take no model-specific arguments"
            )

    def clone(self) -> PoolingParams:
        return copy.deepcopy(self)

    @property
    def set_fields(self) -> List[str]:
        return [n for n in _OPTIONAL_FIELDS if getattr(self, n) is not None]

    def verify(
        self, task: str, matryoshka: Optional[List[int]] = None, is_matryoshka: bool = False
    ) -> None:
        """Refuses what ``task`` does not take (vLLM's words), and ``dimensions`` on a model
        not trained for Matryoshka truncation (``is_matryoshka``; ``matryoshka`` lists the
        sizes it was trained for, when its config says)."""
        if task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}, got {task!r}")
        valid = _TASK_PARAMS[task]
        invalid = [n for n in self.set_fields if n not in valid]
        if invalid:
            raise ValueError(
                f"Task {task} only supports {list(valid)} parameters, does not support "
                f"{invalid} parameter"
            )
        if self.dimensions is not None:
            if not is_matryoshka:
                raise ValueError(
                    "dimensions: the model does not support matryoshka representation, "
                    "changing output dimensions will lead to poor results"
                )
            if matryoshka and self.dimensions not in matryoshka:
                raise ValueError(
                    f"dimensions must be one of the model's matryoshka dimensions {matryoshka}, "
                    f"got {self.dimensions}"
                )
