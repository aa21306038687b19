"""LLM.beam_search with an image prompt on an image model is refused by name: beam steps after
the first are token-id requests that would lose the image (the image placeholders read as
plain tokens: a wrong answer, not an error). Before, the refusal said the model "takes text
only", which is false for LLaVA / Qwen2-VL. The server refuses use_beam_search with images
likewise (serving_chat)."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need

need("torch")
need("transformers")
need("PIL")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.beam_search import BeamSearchParams  # noqa: E402
from pagedkv.testing import save_random_qwen2_vl  # noqa: E402
from PIL import Image  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def test_beam_search_refuses_images_by_name(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = save_random_qwen2_vl(str(tmp_path_factory.mktemp("beam_qwen2_vl")), seed=7)
    llm = LLM(folder, device="cpu", kv_cache_space=0.02, max_model_len=128, block_size=8)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40, 3), np.uint8))
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    prompt = {"prompt": f"USER: {IMAGE} what? ASSISTANT:", "multi_modal_data": {"image": image}}
    with pytest.raises(ValueError, match=r"beam_search is not supported with image inputs"):
        llm.beam_search([prompt], params)
    # A text prompt still searches on the same model.
    out = llm.beam_search([{"prompt": "USER: hello ASSISTANT:"}], params)
    assert len(out[0].sequences) == 2
    assert not llm.llm_engine.has_unfinished_requests()
