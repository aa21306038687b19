"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Field names and defaults follow OpenAI's API reference and vLLM's extensions (top_k, min_p,
repetition_penalty, ...), so the official `openai` client and existing dashboards work
unchanged. Requests accept unknown fields (clients send `user`, `metadata`, ...) and ignore
them; responses are built with only the fields OpenAI defines.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator, model_validator


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class InvalidUnicode(ValueError):
    """A string of the body holds a lone surrogate (JSON's "\\ud800"): no tokenizer, log or
    UTF-8 response can take it. ``param``: where it is, as errors name fields."""

    def __init__(self, param: str) -> None:
        super().__init__(
            f"{param or 'the body'} is not valid Unicode: it holds a lone "
            "surrogate (\\ud800-\\udfff), which UTF-8 cannot encode"
        )
        self.param = param


def lone_surrogate_at(data: Any) -> Optional[str]:
    """The dotted path of the first string (value or key) in ``data`` that UTF-8 cannot
    encode, or None. Iterative: a deep body cannot exhaust the stack."""
    stack: List[tuple] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return ".".join(str(p) for p in path)
        elif isinstance(value, dict):
            for key, item in value.items():
                stack.append(((*path, key), item))
                stack.append((path, key))  # a bad key: named by where it is (checked first)
        elif isinstance(value, list):
            stack.extend(((*path, i), item) for i, item in enumerate(value))
    return None


class _Body(_Request):
    """A whole request body: refused (400) if any string in it is not valid Unicode, before a
    tokenizer or a log line sees it."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        where = lone_surrogate_at(data)
        if where is not None:
            raise InvalidUnicode(where)
        return data


class StreamOptions(BaseModel):
    # vLLM's defaults: a stream_options object that does not mention include_usage asks for
    # the usage chunk; null is "no" (vLLM tests the value's truth).
    include_usage: Optional[bool] = True
    continuous_usage_stats: Optional[bool] = False


class _SamplingFields(_Body):
    """Sampling knobs shared by /v1/completions and /v1/chat/completions."""

    model: Optional[str] = None
    n: int = 1  # null means 1, as in OpenAI's API
    # Finite floats only: NaN / Infinity (Python's json reads them) pass range checks such as
    # "> 0" and would poison the logits.
    temperature: Optional[FiniteFloat] = None
    top_p: Optional[FiniteFloat] = None
    top_k: Optional[int] = None
    min_p: Optional[FiniteFloat] = None
    presence_penalty: Optional[FiniteFloat] = None
    frequency_penalty: Optional[FiniteFloat] = None
    repetition_penalty: Optional[FiniteFloat] = None
    # A torch generator's seed is a signed 64-bit integer (vLLM bounds it the same way).
    seed: Optional[int] = Field(None, ge=-(2**63), le=2**63 - 1)
    stop: Optional[Union[str, List[str]]] = None
    stop_token_ids: Optional[List[int]] = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    spaces_between_special_tokens: bool = True
    # token id (a JSON key, so a string) -> bias; clamped to [-100, 100] as OpenAI does.
    logit_bias: Optional[Dict[str, FiniteFloat]] = None
    prompt_logprobs: Optional[int] = None  # vLLM's extension
    # Checked against what pagedkv supports: only {"type": "text"} (see serving_engine.py).
    response_format: Optional[Any] = None
    # Optional where vLLM's are: clients that send every field, unset ones as null, work.
    stream: Optional[bool] = False
    stream_options: Optional[StreamOptions] = None
    priority: int = 0
    # vLLM's extension: the response id is "cmpl-"/"chatcmpl-" + this (or the X-Request-Id
    # header, which wins); random when neither is given.
    request_id: Optional[str] = None
    # vLLM's meaning: sampling, the n best (by cumulative logprob) of best_of samples; with
    # use_beam_search, the beam width (n when unset), the n best hypotheses returned.
    best_of: Optional[int] = None
    use_beam_search: bool = False  # vLLM's extension (serving_beam_search.py)
    length_penalty: FiniteFloat = 1.0  # beam search's, as HF's: score = logprob / len ** it
    user: Optional[str] = None  # OpenAI's end-user tag: declared (as vLLM does), no effect
    # vLLM's extensions for token-level clients (RL trainers): the prompt's and each choice's
    # token ids in the answer, and logprob tokens spelled "token_id:<id>".
    return_token_ids: Optional[bool] = None
    return_tokens_as_token_ids: Optional[bool] = None
    # vLLM's: keep only the prompt's last k tokens (-1: max_model_len) instead of refusing it.
    truncate_prompt_tokens: Optional[int] = None

    @field_validator("n", mode="before")
    @classmethod
    def _null_n_is_one(cls, value: Any) -> Any:
        return 1 if value is None else value


class CompletionRequest(_SamplingFields):
    # text | [text] | [token id] | [[token id]]
    prompt: Union[str, List[str], List[int], List[List[int]]]
    max_tokens: Optional[int] = 16  # OpenAI's default for the legacy completions API
    logprobs: Optional[int] = None
    echo: Optional[bool] = False
    suffix: Optional[str] = None
    add_special_tokens: bool = True  # vLLM: BOS etc. are added to text prompts by default


class ContentPart(_Request):
    type: str
    text: Optional[str] = None


class ChatMessage(_Request):
    role: str
    content: Optional[Union[str, List[ContentPart]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(_SamplingFields):
    messages: List[ChatMessage]
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    logprobs: Optional[bool] = False
    top_logprobs: Optional[int] = None
    add_generation_prompt: bool = True
    # vLLM's extensions for the template: continue the last message instead of opening a new
    # turn (prefill), documents for RAG templates, and free variables for the template.
    continue_final_message: bool = False
    documents: Optional[List[Dict[str, Any]]] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    chat_template: Optional[str] = None
    # vLLM's: the answer starts with the last message when it has the answer's role.
    echo: Optional[bool] = False
    # vLLM's default for chat: the template writes the special tokens itself.
    add_special_tokens: bool = False
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    # Tool calls are made in one answer (tool_calls.py): accepted and without effect, as in
    # vLLM.
    parallel_tool_calls: Optional[bool] = None
    # Handed to the chat template as a variable (templates of reasoning models read it; others,
    # SmolLM2's included, ignore it); checked against OpenAI's values.
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high", "xhigh"]] = None


class TokenizeRequest(_Body):
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[List[ChatMessage]] = None
    # vLLM's defaults: true for a prompt, false for messages (the template writes the
    # special tokens), as for generation.
    add_special_tokens: Optional[bool] = None
    add_generation_prompt: bool = True
    # As for chat (vLLM's TokenizeChatRequest): the same prompt a chat request would get.
    continue_final_message: bool = False
    documents: Optional[List[Dict[str, Any]]] = None
    chat_template_kwargs: Optional[Dict[str, Any]] = None
    chat_template: Optional[str] = None
    return_token_strs: Optional[bool] = False  # vLLM's extension: each token's text too


class DetokenizeRequest(_Body):
    model: Optional[str] = None
    tokens: List[int]


# ---------------------------------------------------------------- responses


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class PromptLogprob(BaseModel):
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


class CompletionLogProbs(BaseModel):
    text_offset: List[int] = Field(default_factory=list)
    token_logprobs: List[Optional[float]] = Field(default_factory=list)
    tokens: List[str] = Field(default_factory=list)
    top_logprobs: List[Optional[Dict[str, float]]] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    # vLLM's extension: per prompt token, {token id: {logprob, rank, decoded_token}}; the
    # first token has none.
    prompt_logprobs: Optional[List[Optional[Dict[int, PromptLogprob]]]] = None
    prompt_token_ids: Optional[List[int]] = None  # with return_token_ids (vLLM)
    token_ids: Optional[List[int]] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[CompletionChoice]
    usage: Optional[UsageInfo] = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[List[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: List[TopLogprob] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: Optional[List[ChatTokenLogprob]] = None


class ResponseMessage(BaseModel):
    role: str = "assistant"
    content: Optional[str] = None
    reasoning_content: Optional[str] = None  # with --reasoning-parser (vLLM's field)
    # OpenAI tool calls ({id, type: "function", function: {name, arguments}}), see tool_calls.py
    tool_calls: List[Dict[str, Any]] = Field(default_factory=list)


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None


class ChatChoice(BaseModel):
    index: int
    message: ResponseMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None
    token_ids: Optional[List[int]] = None  # with return_token_ids (vLLM)


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: List[ChatChoice]
    usage: Optional[UsageInfo] = None
    prompt_logprobs: Optional[List[Optional[Dict[int, PromptLogprob]]]] = None  # as vLLM
    prompt_token_ids: Optional[List[int]] = None  # with return_token_ids (vLLM)


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ModelPermission(BaseModel):
    """vLLM's (and the legacy OpenAI API's) permission entry of a model card: clients that
    read it (older openai packages, UIs) find the same fields."""

    id: str = Field(default_factory=lambda: random_id("modelperm"))
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=lambda: int(time.time()))
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: Optional[str] = None
    is_blocking: bool = False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedkv"
    root: Optional[str] = None
    parent: Optional[str] = None  # vLLM: the base model of a LoRA adapter; None for a base
    max_model_len: Optional[int] = None
    permission: List[ModelPermission] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: List[ModelCard]


_TOKEN_ID_KEYS = ("prompt_token_ids", "token_ids")


def dump(response: BaseModel) -> Dict[str, Any]:
    """A response as JSON data, without the token-id fields of a request that did not ask for
    them (return_token_ids), so that ordinary answers keep OpenAI's shape."""
    body = response.model_dump()
    for obj in (body, *body.get("choices", ())):
        for key in _TOKEN_ID_KEYS:
            if key in obj and obj[key] is None:
                del obj[key]
    return body


def chunk(obj: Dict[str, Any]) -> str:
    """One server-sent event carrying a JSON object."""
    import json

    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


DONE = "data: [DONE]\n\n"
