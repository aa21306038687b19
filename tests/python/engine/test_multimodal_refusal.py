"""Image / audio inputs are refused by name, never dropped: a prompt dict's multi_modal_data and
a chat message's image_url part raise in LLM.generate / LLM.chat / LLMEngine.add_request and
answer 400 in the server, and the engine stays clean for the next request."""

from __future__ import annotations

import re

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.multimodal import UnsupportedModalityError  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

GREEDY = SamplingParams(temperature=0, max_tokens=2)
IMAGE = object()  # any payload: it must be refused before anyone reads it


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    out = str(tmp_path_factory.mktemp("tiny_mm"))
    save_random_model(
        out,
        "tiny-llama",
        seed=1,
        tokenizer=False,
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=64,
        num_hidden_layers=1,
        vocab_size=128,
        max_position_embeddings=256,
    )
    return LLM(out, device="cpu", kv_cache_space=0.01, max_model_len=64, skip_tokenizer_init=True)


@pytest.mark.parametrize(
    "prompt, where, modality",
    [
        (
            {"prompt_token_ids": [1, 2, 3], "multi_modal_data": {"image": IMAGE}},
            "multi_modal_data']['image']",
            "image",
        ),
        (
            {"prompt_token_ids": [1, 2], "multi_modal_data": {"audio": (IMAGE, 16000)}},
            "multi_modal_data']['audio']",
            "audio",
        ),
        (
            {"prompt_token_ids": [1, 2], "mm_processor_kwargs": {"num_crops": 4}},
            "mm_processor_kwargs'",
            "multimodal",
        ),
    ],
)
def test_generate_refuses_multi_modal_data(llm: LLM, prompt, where, modality) -> None:
    with pytest.raises(
        UnsupportedModalityError,
        match=re.escape(f"prompts['{where}") + f".*{modality} inputs are not supported",
    ):
        llm.generate(prompt, GREEDY, use_tqdm=False)
    # Batched: the whole call is refused before any request starts.
    with pytest.raises(UnsupportedModalityError, match=r"^prompts\[1\]"):
        llm.generate([{"prompt_token_ids": [1, 2]}, prompt], GREEDY, use_tqdm=False)
    assert_no_leak(llm)
    # The same prompt without its image runs.
    plain = {"prompt_token_ids": prompt["prompt_token_ids"]}
    assert len(llm.generate(plain, GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 2


def test_engine_add_request_refuses_multi_modal_data(llm: LLM) -> None:
    eng = llm.llm_engine
    with pytest.raises(UnsupportedModalityError, match=r"^prompt\['multi_modal_data'\]"):
        eng.add_request(
            "mm-0", {"prompt_token_ids": [1, 2], "multi_modal_data": {"image": IMAGE}}, GREEDY
        )
    assert not eng.has_unfinished_requests()


def test_unknown_prompt_keys_are_refused_by_name(llm: LLM) -> None:
    with pytest.raises(ValueError, match=r"unsupported prompt keys \['prompt_embeds'\]"):
        llm.generate(
            {"prompt_token_ids": [1], "prompt_embeds": torch.zeros(1, 64)}, GREEDY, use_tqdm=False
        )
    with pytest.raises(TypeError, match=r"multi_modal_data'\] must be a dict"):
        llm.generate({"prompt_token_ids": [1], "multi_modal_data": [IMAGE]}, GREEDY, use_tqdm=False)


@pytest.mark.parametrize(
    "part, modality",
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
        ({"type": "video_url", "video_url": {"url": "http://x/v.mp4"}}, "video"),
    ],
)
def test_chat_refuses_media_parts(part, modality) -> None:
    from pagedkv.engine.llm_inputs import normalise_conversations

    convo = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(
        UnsupportedModalityError,
        match=rf"^messages\[0\]\['content'\]\[1\] \(type '{part['type']}'\): "
        rf"{modality} inputs are not supported",
    ):
        normalise_conversations(convo)


@pytest.mark.parametrize(
    "part, modality",
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "audio"),
    ],
)
def test_server_answers_400_for_media_parts(part, modality) -> None:
    need("fastapi")
    from pagedkv.entrypoints.openai.errors import APIError
    from pagedkv.entrypoints.openai.protocol import ChatMessage
    from pagedkv.entrypoints.openai.serving_chat import message_dicts

    msgs = [
        ChatMessage.model_validate(
            {"role": "user", "content": [{"type": "text", "text": "describe"}, part]}
        )
    ]
    with pytest.raises(APIError) as err:
        message_dicts(msgs)
    assert err.value.status == 400
    assert err.value.param == "messages.0.content"
    assert f"{modality} inputs are not supported" in err.value.message
    text_only = [
        ChatMessage.model_validate(
            {"role": "user", "content": [{"type": "text", "text": "describe"}]}
        )
    ]
    assert message_dicts(text_only) == [{"role": "user", "content": "describe"}]
