"""Images, prompts and checks shared by the image-model tests (LLaVA, LLaVA-NeXT, Qwen2-VL:
offline against HF transformers, and through the OpenAI server's image_url parts)."""

from __future__ import annotations

import base64
import io
from typing import Any, List, Sequence, Tuple

import numpy as np

# A (prompt, [(seed, height, width) of each image]) case of the model tests.
ImageCase = Tuple[str, Sequence[Tuple[int, int, int]]]


def random_image(seed: int, h: int, w: int) -> Any:
    """An h x w RGB PIL image of uniform random pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def png_data_url(image: Any) -> str:
    """``image`` as a base64 PNG data: URL (an OpenAI image_url)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_prompts(cases: Sequence[ImageCase]) -> List[Any]:
    """The engine's inputs for ``cases``: a prompt dict with its images, or the bare text."""
    return [
        {"prompt": p, "multi_modal_data": {"image": [random_image(*s) for s in shapes]}}
        if shapes
        else p
        for p, shapes in cases
    ]


def hf_greedy_with_logprobs(
    model: Any, inputs: Any, max_new_tokens: int
) -> Tuple[List[int], List[float]]:
    """HF's greedy continuation of ``inputs`` (a processor's output) and each token's logprob."""
    import torch

    with torch.no_grad():
        gen = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = gen.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    logprobs = [torch.log_softmax(s[0], -1)[t].item() for s, t in zip(gen.scores, tokens)]
    return tokens, logprobs


def assert_greedy_matches(
    out: Any, tokens: List[int], logprobs: List[float], what: object, atol: float
) -> None:
    """One RequestOutput (requested with logprobs=0) has HF's greedy tokens and logprobs."""
    got = out.outputs[0]
    assert list(got.token_ids) == tokens, what
    mine = [step[t].logprob for step, t in zip(got.logprobs, got.token_ids)]
    np.testing.assert_allclose(mine, logprobs, atol=atol, err_msg=str(what))


def chat_with_image(http: Any, part: dict, question: str) -> Any:
    """POST one user message (``part`` then the text ``question``) to /v1/chat/completions:
    6 greedy tokens, their ids returned."""
    return http.post(
        "/v1/chat/completions",
        json={
            "model": http.app.state.pagedkv.model_name,
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": question}]}],
            "max_tokens": 6,
            "temperature": 0,
            "return_token_ids": True,
        },
    )


def offline_chat_answer(llm: Any, placeholder: str, question: str, image: Any) -> List[int]:
    """What the offline engine answers (6 greedy tokens) for the chat template over
    ``placeholder`` + newline + ``question`` (vLLM's placement of an image part) and ``image``."""
    from pagedkv import SamplingParams

    text = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": f"{placeholder}\n{question}"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    params = SamplingParams(temperature=0, max_tokens=6)
    want = llm.generate({"prompt": text, "multi_modal_data": {"image": image}}, params)
    return list(want[0].outputs[0].token_ids)
