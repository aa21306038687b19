"""The server's sampling defaults come from the model's generation_config.json (vLLM's
--generation-config): fields the request leaves out take the model's values, fields it sets
win, and max_new_tokens caps a chat request that names no length."""

from __future__ import annotations

from types import SimpleNamespace

from support.deps import need

need("fastapi")

from pagedkv.entrypoints.openai.protocol import (  # noqa: E402
    ChatCompletionRequest,
    CompletionRequest,
)
from pagedkv.entrypoints.openai.serving_engine import OpenAIServing  # noqa: E402

DEFAULTS = {"temperature": 0.3, "top_p": 0.6, "top_k": 9, "max_tokens": 12}


def _serving(defaults: dict) -> OpenAIServing:
    serving = object.__new__(OpenAIServing)  # no app or tokenizer: only sampling_params runs
    serving.engine = SimpleNamespace(model_config=SimpleNamespace(generation_defaults=defaults))
    return serving


def test_request_fields_left_out_take_the_models_defaults() -> None:
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], top_p=0.9)
    p = _serving(DEFAULTS).sampling_params(chat, 100, None)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.3, 0.9, 9, 12)
    chat.max_tokens = 50  # a length the request names wins over max_new_tokens
    assert _serving(DEFAULTS).sampling_params(chat, 50, None).max_tokens == 50
    completion = CompletionRequest(model="m", prompt="hi", temperature=0.5)
    p = _serving(DEFAULTS).sampling_params(completion, 16, None)
    assert (p.temperature, p.top_k, p.max_tokens) == (0.5, 9, 16)


def test_without_a_generation_config_the_defaults_are_vllms() -> None:
    chat = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    p = _serving({}).sampling_params(chat, 100, None)
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, 0, 100)
