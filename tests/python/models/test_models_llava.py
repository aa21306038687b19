"""LLaVA-1.5 image inputs against HF transformers: a tiny random LlavaForConditionalGeneration
(CLIP vision tower + Llama, built and saved with transformers' own classes, random weights with
non-zero biases and norm weights), its LlavaProcessor, and greedy tokens equal to HF's generate
on image + text prompts (float32, CPU); images keyed into the prefix cache by content."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.deps import need
from support.images import random_image

torch = need("torch")
need("transformers")
need("PIL")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.multimodal import UnsupportedModalityError  # noqa: E402
from pagedkv.testing import IMAGE_TOKEN, save_random_llava  # noqa: E402
from PIL import Image  # noqa: E402

PROMPT_ONE = "USER: <image>\nWhat is shown here? ASSISTANT:"
PROMPT_TWO = "USER: <image> and <image>: which is brighter? ASSISTANT:"
MAX_TOKENS = 8


def _image(seed: int, h: int = 37, w: int = 45) -> Any:
    return random_image(seed, h, w)


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory) -> str:
    return save_random_llava(str(tmp_path_factory.mktemp("tiny_llava")), seed=3)


_HF: dict = {}


def _hf_greedy(folder: str, prompt: str, images: list) -> list[int]:
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    if folder not in _HF:
        _HF[folder] = (
            AutoProcessor.from_pretrained(folder),
            LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval(),
        )
    processor, model = _HF[folder]
    inputs = processor(text=prompt, images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def llm_image_id(folder: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(folder).image_token_index)


def _llm(folder: str, **kw) -> LLM:
    return LLM(folder, device="cpu", kv_cache_space=0.02, max_model_len=128, block_size=8, **kw)


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


def test_greedy_equals_hf_with_images_in_one_batch(llava_dir: str) -> None:
    """Two prompts with different images (one with two images) in one batch, and again with
    prefill chunks that cut through the image placeholders (serial and overlapped steps)."""
    cases = [(PROMPT_ONE, [_image(1)]), (PROMPT_TWO, [_image(2), _image(3, 60, 30)])]
    expected = [_hf_greedy(llava_dir, p, ims) for p, ims in cases]
    prompts = [{"prompt": p, "multi_modal_data": {"image": ims}} for p, ims in cases]
    chunked = {"max_num_batched_tokens": 12, "max_num_seqs": 2}
    for kw in ({}, chunked, {**chunked, "async_scheduling": True}):
        outs = _llm(llava_dir, **kw).generate(prompts, GREEDY, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got == expected, kw
        # The engine's prompt is HF's expanded one: 16 placeholders per image.
        image_id = llm_image_id(llava_dir)
        assert [o.prompt_token_ids.count(image_id) for o in outs] == [16, 32]


def test_prefix_cache_is_keyed_by_image_content(llava_dir: str) -> None:
    llm = _llm(llava_dir)
    first = llm.generate(
        {"prompt": PROMPT_ONE, "multi_modal_data": {"image": _image(5)}}, GREEDY, use_tqdm=False
    )[0]
    same = llm.generate(
        {"prompt": PROMPT_ONE, "multi_modal_data": {"image": _image(5)}}, GREEDY, use_tqdm=False
    )[0]
    other = llm.generate(
        {"prompt": PROMPT_ONE, "multi_modal_data": {"image": _image(6)}}, GREEDY, use_tqdm=False
    )[0]
    assert first.num_cached_tokens == 0
    assert same.num_cached_tokens >= 16  # the image's blocks came from the cache
    assert list(same.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    assert other.num_cached_tokens == 0  # another image shares no block, not even the text
    assert list(other.outputs[0].token_ids) == _hf_greedy(llava_dir, PROMPT_ONE, [_image(6)])
    # (and the images matter: HF answers the two differently)
    assert _hf_greedy(llava_dir, PROMPT_ONE, [_image(5)]) != list(other.outputs[0].token_ids)


def test_image_prompts_are_checked(llava_dir: str) -> None:
    llm = _llm(llava_dir, limit_mm_per_prompt={"image": 1})
    two = {"prompt": PROMPT_TWO, "multi_modal_data": {"image": [_image(1), _image(2)]}}
    with pytest.raises(ValueError, match=r"2 images, more than limit_mm_per_prompt allows \(1\)"):
        llm.generate(two, GREEDY, use_tqdm=False)
    wrong = {"prompt": PROMPT_ONE + IMAGE_TOKEN, "multi_modal_data": {"image": _image(1)}}
    with pytest.raises(ValueError, match=r"2 image tokens .* for 1 image"):
        llm.generate(wrong, GREEDY, use_tqdm=False)
    with pytest.raises(UnsupportedModalityError, match=r"audio inputs are not supported"):
        llm.generate(
            {"prompt": "hi", "multi_modal_data": {"audio": (b"", 16000)}}, GREEDY, use_tqdm=False
        )
    # audit6: a 0x0 image was a ZeroDivisionError from the image processor.
    with pytest.raises(ValueError, match=r"\[0\] is an empty image \(0x0\)"):
        llm.generate(
            {"prompt": PROMPT_ONE, "multi_modal_data": {"image": Image.new("RGB", (0, 0))}},
            GREEDY,
            use_tqdm=False,
        )
    with pytest.raises(TypeError, match=r"must be a PIL.Image"):
        llm.generate(
            {"prompt": PROMPT_ONE, "multi_modal_data": {"image": np.zeros((4, 4, 3))}},
            GREEDY,
            use_tqdm=False,
        )
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_equals_hf_on_cuda(llava_dir: str) -> None:
    """The CUDA kernels (float32, eager and CUDA-graph decode) against HF on the CPU."""
    cases = [(PROMPT_ONE, [_image(7)]), (PROMPT_TWO, [_image(8), _image(9)])]
    expected = [_hf_greedy(llava_dir, p, ims) for p, ims in cases]
    llm = LLM(llava_dir, device="cuda", dtype="float32", max_model_len=128, block_size=16)
    prompts = [{"prompt": p, "multi_modal_data": {"image": ims}} for p, ims in cases]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected


def test_images_survive_recompute_preemption(llava_dir: str) -> None:
    """A KV cache too small for three image prompts: preempted requests recompute their prompt
    (image rows included) and answer as without preemption."""
    prompts = [
        {"prompt": PROMPT_ONE, "multi_modal_data": {"image": _image(20 + i)}} for i in (0, 1, 2)
    ]
    params = SamplingParams(temperature=0, max_tokens=24)
    roomy = _llm(llava_dir).generate(prompts, params, use_tqdm=False)
    tight = LLM(llava_dir, device="cpu", num_gpu_blocks_override=12, max_model_len=96, block_size=8)
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.llm_engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in roomy]


def test_chat_with_image_parts(llava_dir: str) -> None:
    """LLM.chat: an image_pil part (and a data: image_url) becomes the image token in the
    rendered text, and the image goes with the prompt: the answer is generate()'s on that text."""
    import base64
    import io

    llm = _llm(llava_dir)
    image = _image(11)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    question = {"type": "text", "text": "What is this?"}
    text = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": f"{IMAGE_TOKEN}\nWhat is this?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    want = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    for part in (
        {"type": "image_pil", "image_pil": image},
        {"type": "image_url", "image_url": {"url": url}},
    ):
        got = llm.chat([{"role": "user", "content": [part, question]}], GREEDY, use_tqdm=False)
        assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"--allowed-media-domains"):
        llm.chat(
            [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
                }
            ],
            GREEDY,
        )
