"""A conversation's image parts beyond limit_mm_per_prompt are refused before they are fetched
or decoded (a request of many image_url parts must not make the server download them all)."""

from __future__ import annotations

import pytest
from support.deps import need
from support.images import png_data_url, random_image

need("torch")
need("PIL")

from pagedkv.engine.multimodal import ChatImages  # noqa: E402


def _part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def test_parts_past_the_limit_are_refused_before_loading() -> None:
    images = ChatImages("LlavaForConditionalGeneration", "<image>", max_images=1)
    assert images.take(_part(png_data_url(random_image(1, 8, 8))), "messages.0") == "<image>"
    # The next part would be a refused file read; the limit answers first.
    with pytest.raises(ValueError, match=r"messages\.1: more images than limit_mm_per_prompt"):
        images.take(_part("file:///etc/passwd"), "messages.1")
    assert len(images.images or []) == 1
    unlimited = ChatImages("LlavaForConditionalGeneration", "<image>")
    with pytest.raises(ValueError, match="reading image files is not allowed"):
        unlimited.take(_part("file:///etc/passwd"), "messages.1")
