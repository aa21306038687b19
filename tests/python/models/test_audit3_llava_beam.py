"""LLM.beam_search on a LLaVA checkpoint with an image prompt: it said "image inputs are not
supported: the model takes text only" (the prompts were checked as for a text-only model);
beam search does not carry images, so it now refuses them by name, as the server does."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
need("transformers")
Image = need("PIL.Image")

from pagedkv import LLM, BeamSearchParams  # noqa: E402
from pagedkv.testing import IMAGE_TOKEN, save_random_llava  # noqa: E402


def test_beam_search_refuses_images_by_name(tmp_path) -> None:
    llm = LLM(save_random_llava(str(tmp_path)), device="cpu", kv_cache_space=0.02, max_model_len=96)
    image = Image.new("RGB", (28, 28), (200, 30, 90))
    prompt = {
        "prompt": f"USER: {IMAGE_TOKEN}\nWhat? ASSISTANT:",
        "multi_modal_data": {"image": image},
    }
    params = BeamSearchParams(beam_width=2, max_tokens=2)
    with pytest.raises(ValueError, match=r"beam_search does not take image inputs"):
        llm.beam_search([prompt], params)
    # Text prompts still search.
    assert len(llm.beam_search(["USER: Hi ASSISTANT:"], params)[0].sequences) == 2
