"""Qwen2-VL image inputs against HF transformers: a tiny random Qwen2VLForConditionalGeneration
(2-block vision transformer, Qwen2 text model with M-RoPE sections [4, 6, 6], random weights
with non-zero biases and norm weights); greedy tokens equal to HF's generate (float32, CPU) on
image + text prompts, two images in one prompt and a batch mixing image and text-only prompts,
with whole and chunked prefills and overlapped steps; the prompt's M-RoPE positions equal HF's
get_rope_index.

HF's inputs are built from the image processor and the tokenizer (Qwen2VLProcessor needs
torchvision for its video half): each <|image_pad|> repeated image_grid_thw.prod() / 4 times,
the processor's rule; HF computes the positions itself inside generate."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.images import (
    assert_greedy_matches,
    hf_greedy_with_logprobs,
    image_prompts,
    random_image,
)

torch = need("torch")
need("transformers")
need("PIL")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.multimodal import UnsupportedModalityError  # noqa: E402
from pagedkv.testing import save_random_qwen2_vl  # noqa: E402

MAX_TOKENS = 8
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
# Greedy with each token's logprob: compared to HF's too (tokens alone barely move when only
# one position component is used on so tiny a model; the logprobs move by > 0.5).
GREEDY_LOGPROBS = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, logprobs=0)
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
# Shapes giving grids of different heights and widths (rows 4..16 per image).
CASES = [
    (f"USER: {IMAGE}What is shown here? ASSISTANT:", [(1, 60, 110)]),
    (f"USER: {IMAGE} and {IMAGE}: which is brighter? ASSISTANT:", [(2, 110, 50), (3, 56, 56)]),
    ("USER: tell me a story ASSISTANT:", []),
]


@pytest.fixture(scope="module")
def qwen2_vl_dir(tmp_path_factory) -> str:
    return save_random_qwen2_vl(str(tmp_path_factory.mktemp("tiny_qwen2_vl")), seed=7)


_HF: dict = {}


def _hf(folder: str):
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLForConditionalGeneration

    if folder not in _HF:
        model = Qwen2VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
        _HF[folder] = (
            AutoImageProcessor.from_pretrained(folder),
            AutoTokenizer.from_pretrained(folder),
            model.eval(),
        )
    return _HF[folder]


def _hf_inputs(folder: str, prompt: str, shapes: list) -> dict:
    processor, tok, model = _hf(folder)
    pad = model.config.image_token_id
    ids = tok(prompt)["input_ids"]
    kw = {}
    if shapes:
        out = processor(images=[random_image(*s) for s in shapes], return_tensors="pt")
        counts = iter((out["image_grid_thw"].prod(-1) // 4).tolist())
        ids = [t for i in ids for t in ([pad] * next(counts) if i == pad else [i])]
        kw = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "mm_token_type_ids": (input_ids == pad).int(),
        **kw,
    }


def _hf_greedy(folder: str, cases: list) -> list[tuple[list[int], list[float]]]:
    """HF's greedy tokens and their logprobs, prompt by prompt."""
    model = _hf(folder)[2]
    return [
        hf_greedy_with_logprobs(model, _hf_inputs(folder, prompt, shapes), MAX_TOKENS)
        for prompt, shapes in cases
    ]


def _assert_matches(outs: list, expected: list, what: object, atol: float = 1e-4) -> None:
    for out, (tokens, logprobs) in zip(outs, expected):
        assert_greedy_matches(out, tokens, logprobs, what, atol)


def _llm(folder: str, **kw) -> LLM:
    return LLM(folder, device="cpu", kv_cache_space=0.02, max_model_len=160, block_size=8, **kw)


def test_greedy_equals_hf_mixed_batch(qwen2_vl_dir: str) -> None:
    expected = _hf_greedy(qwen2_vl_dir, CASES)
    chunked = {"max_num_batched_tokens": 16, "max_num_seqs": 3}
    for kw in ({}, chunked, {**chunked, "async_scheduling": True}):
        outs = _llm(qwen2_vl_dir, **kw).generate(
            image_prompts(CASES), GREEDY_LOGPROBS, use_tqdm=False
        )
        _assert_matches(outs, expected, kw)


def test_mrope_positions_equal_hf_get_rope_index(qwen2_vl_dir: str) -> None:
    """The prompt's positions computed at admission are HF's, and they are not the plain ones
    (the case moves later tokens: delta != 0)."""
    llm = _llm(qwen2_vl_dir)
    reader = llm.llm_engine.input_processor.images
    prompt, shapes = CASES[1]
    inputs = _hf_inputs(qwen2_vl_dir, prompt, shapes)
    ids = llm.get_tokenizer().encode(prompt, add_special_tokens=False)
    expanded, mm = reader.process(ids, {"image": [random_image(*s) for s in shapes]}, "prompt")
    assert expanded == inputs["input_ids"][0].tolist()
    hf_model = _hf(qwen2_vl_dir)[2]
    want, delta = hf_model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
    )
    assert np.array_equal(mm.mrope_positions, want[:, 0].numpy())
    assert mm.mrope_delta == int(delta) != 0


def test_image_requests_survive_recompute_preemption(qwen2_vl_dir: str) -> None:
    """A KV cache too small for three image prompts: a preempted request recomputes its prompt
    and generated tokens (rows past the prompt at index + delta) and answers as without
    preemption, logprobs included; the prefix cache keys image blocks by the image."""
    prompts = [
        {"prompt": CASES[0][0], "multi_modal_data": {"image": random_image(20 + i, 110, 110)}}
        for i in (0, 1, 2)
    ]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=0)
    roomy_llm = _llm(qwen2_vl_dir)
    roomy = roomy_llm.generate(prompts, params, use_tqdm=False)
    tight = LLM(
        qwen2_vl_dir, device="cpu", num_gpu_blocks_override=9, max_model_len=64, block_size=8
    )
    outs = tight.generate(prompts, params, use_tqdm=False)
    assert tight.llm_engine.scheduler.num_preemptions > 0
    for got, want in zip(outs, roomy):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        lp = [s[t].logprob for s, t in zip(got.outputs[0].logprobs, got.outputs[0].token_ids)]
        ref = [s[t].logprob for s, t in zip(want.outputs[0].logprobs, want.outputs[0].token_ids)]
        np.testing.assert_allclose(lp, ref, atol=1e-5)
    again = roomy_llm.generate(prompts[:1], params, use_tqdm=False)[0]
    assert again.num_cached_tokens >= 8  # the image's first block came from the cache
    assert again.outputs[0].token_ids == roomy[0].outputs[0].token_ids
    other = {"prompt": CASES[0][0], "multi_modal_data": {"image": random_image(30, 110, 110)}}
    assert roomy_llm.generate(other, params, use_tqdm=False)[0].num_cached_tokens == 0


def test_chat_image_part_is_the_vision_tokens(qwen2_vl_dir: str) -> None:
    """LLM.chat: an image part becomes <|vision_start|><|image_pad|><|vision_end|> in the
    rendered text (parts joined by newlines); the answer is generate()'s on that text."""
    llm = _llm(qwen2_vl_dir)
    image = random_image(11, 70, 70)
    text = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": f"{IMAGE}\nWhat is this?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    want = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, GREEDY)
    part = {"type": "image_pil", "image_pil": image}
    question = {"type": "text", "text": "What is this?"}
    got = llm.chat([{"role": "user", "content": [part, question]}], GREEDY, use_tqdm=False)
    assert got[0].outputs[0].token_ids == want[0].outputs[0].token_ids
    # Images only: a video is refused by name, never dropped.
    with pytest.raises(UnsupportedModalityError, match=r"video inputs are not supported"):
        llm.generate({"prompt": text, "multi_modal_data": {"video": [image, image]}}, GREEDY)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_equals_hf_on_cuda(qwen2_vl_dir: str) -> None:
    """The CUDA kernels (float32; prompt chunks with images eager, decodes on CUDA graphs at
    index + delta) against HF on the CPU."""
    expected = _hf_greedy(qwen2_vl_dir, CASES)
    llm = LLM(qwen2_vl_dir, device="cuda", dtype="float32", max_model_len=160, block_size=16)
    outs = llm.generate(image_prompts(CASES), GREEDY_LOGPROBS, use_tqdm=False)
    _assert_matches(outs, expected, "cuda", atol=2e-3)


def test_hub_config_and_transformers5_weight_names(qwen2_vl_dir: str) -> None:
    """A hub-style config.json (text keys at the top level, transformers 4's rope_scaling
    {"type": "mrope"}) reads as the nested one; weights named as transformers 5 saves them
    (model.visual.*, model.language_model.*) load to the same parameters."""
    import json
    import os

    from pagedkv.models.config import ModelConfig
    from pagedkv.models.qwen2_vl import Qwen2VLForConditionalGeneration
    from safetensors.torch import load_file

    with open(os.path.join(qwen2_vl_dir, "config.json")) as f:
        nested = json.load(f)
    flat = {k: v for k, v in nested.items() if k != "text_config"}
    text = dict(nested["text_config"])
    params = text.pop("rope_parameters")
    text["rope_theta"] = params["rope_theta"]
    text["rope_scaling"] = {"type": "mrope", "mrope_section": params["mrope_section"]}
    text.pop("model_type")
    flat.update(text)
    a, b = ModelConfig.from_hf_dict(nested), ModelConfig.from_hf_dict(flat)
    assert a.extra["mrope_section"] == b.extra["mrope_section"] == [4, 6, 6]
    assert (a.rope_scaling, a.rope_theta, a.num_hidden_layers) == (
        b.rope_scaling,
        b.rope_theta,
        b.num_hidden_layers,
    )
    tensors = load_file(os.path.join(qwen2_vl_dir, "model.safetensors"))
    v4 = Qwen2VLForConditionalGeneration(a)
    v4.load_weights(iter(tensors.items()))

    def v5_name(name: str) -> str:
        if name.startswith("visual."):
            return "model." + name
        if name.startswith("model."):
            return "model.language_model." + name.removeprefix("model.")
        return name

    v5 = Qwen2VLForConditionalGeneration(b)
    v5.load_weights((v5_name(n), t) for n, t in tensors.items())
    for (name, p), (_, q) in zip(v4.state_dict().items(), v5.state_dict().items()):
        assert torch.equal(p, q), name


def test_an_image_the_processor_refuses_is_named(qwen2_vl_dir: str) -> None:
    """Qwen2-VL's processor refuses aspect ratios above 200 with a message naming no image: the
    error names which one, and the engine goes on serving."""
    llm = _llm(qwen2_vl_dir)
    prompt = f"USER: {IMAGE} and {IMAGE}: which? ASSISTANT:"
    images = [random_image(1, 56, 56), random_image(2, 2, 450)]
    with pytest.raises(ValueError, match=r"\['image'\]\[1\]: the image processor refused it"):
        llm.generate({"prompt": prompt, "multi_modal_data": {"image": images}}, GREEDY)
    outs = llm.generate(image_prompts(CASES[:1]), GREEDY, use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == MAX_TOKENS
