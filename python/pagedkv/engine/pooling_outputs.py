"""What pooling requests return (vLLM's names): a PoolingRequestOutput holding the pooled tensor,
and the typed views LLM.embed / classify / score hand out (``.outputs.embedding``,
``.outputs.probs``, ``.outputs.score``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, List, Optional, TypeVar

import torch


@dataclass
class PoolingOutput:
    """The pooler's result: [hidden] (or [dimensions]) for one vector per prompt, [num_labels]
    for class scores, [tokens, ...] for per-token outputs (encode, reward)."""

    data: torch.Tensor


_O = TypeVar("_O")


@dataclass
class PoolingRequestOutput(Generic[_O]):
    request_id: str
    outputs: _O
    prompt_token_ids: List[int]
    finished: bool
    prompt: Optional[str] = None
    num_cached_tokens: int = 0


@dataclass
class EmbeddingOutput:
    embedding: List[float]

    @staticmethod
    def from_base(out: PoolingOutput) -> EmbeddingOutput:
        if out.data.dim() != 1:
            raise ValueError(f"an embedding is one vector, got shape {tuple(out.data.shape)}")
        return EmbeddingOutput(out.data.tolist())

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: List[float]

    @staticmethod
    def from_base(out: PoolingOutput) -> ClassificationOutput:
        if out.data.dim() != 1:
            raise ValueError(f"class scores are one vector, got shape {tuple(out.data.shape)}")
        return ClassificationOutput(out.data.tolist())

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float

    @staticmethod
    def from_base(out: PoolingOutput) -> ScoringOutput:
        if out.data.numel() != 1:
            raise ValueError(f"a score is one number, got shape {tuple(out.data.shape)}")
        return ScoringOutput(float(out.data.reshape(()).item()))


_R = TypeVar("_R", bound=PoolingRequestOutput)


def _typed(cls: type[_R], out: PoolingRequestOutput, outputs: object) -> _R:
    return cls(
        out.request_id,
        outputs,
        out.prompt_token_ids,
        out.finished,
        out.prompt,
        out.num_cached_tokens,
    )


class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    @staticmethod
    def from_base(out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return _typed(EmbeddingRequestOutput, out, EmbeddingOutput.from_base(out.outputs))


class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    @staticmethod
    def from_base(out: PoolingRequestOutput) -> ClassificationRequestOutput:
        return _typed(ClassificationRequestOutput, out, ClassificationOutput.from_base(out.outputs))


class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    @staticmethod
    def from_base(out: PoolingRequestOutput) -> ScoringRequestOutput:
        return _typed(ScoringRequestOutput, out, ScoringOutput.from_base(out.outputs))
