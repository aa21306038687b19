"""Request bodies of the pooling routes: OpenAI's /v1/embeddings, vLLM's /pooling, /classify,
/score and /rerank (Jina / Cohere style). Unknown fields are logged as ignored, as elsewhere."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Union

from pagedkv.entrypoints.openai.protocol import _Body

# A prompt as OpenAI's `input` takes it: text, texts, token ids, lists of token ids.
Input = Union[str, List[str], List[int], List[List[int]]]


class _PoolingBody(_Body):
    model: Optional[str] = None
    truncate_prompt_tokens: Optional[int] = None
    add_special_tokens: bool = True
    priority: int = 0
    request_id: Optional[str] = None
    user: Optional[str] = None


class EmbeddingRequest(_PoolingBody):
    input: Input
    encoding_format: str = "float"  # "float" | "base64"
    dimensions: Optional[int] = None
    # vLLM's: the element type and byte order of a base64 answer (float lists ignore them).
    embed_dtype: str = "float32"
    endianness: str = "native"
    normalize: Optional[bool] = None  # vLLM's extension


class PoolingRequest(EmbeddingRequest):
    task: Optional[str] = None  # vLLM: the pooling task (default: the model's)
    use_activation: Optional[bool] = None
    softmax: Optional[bool] = None
    activation: Optional[bool] = None


class ClassificationRequest(_PoolingBody):
    input: Input
    use_activation: Optional[bool] = None
    activation: Optional[bool] = None
    softmax: Optional[bool] = None


class ScoreRequest(_PoolingBody):
    text_1: Union[str, List[str]]
    text_2: Union[str, List[str]]
    use_activation: Optional[bool] = None
    activation: Optional[bool] = None


class RerankRequest(_PoolingBody):
    query: str
    documents: List[Union[str, Dict[str, Any]]]
    top_n: Optional[int] = None
    return_documents: bool = True
    use_activation: Optional[bool] = None
    activation: Optional[bool] = None  # (vLLM's older name, as on /score)
