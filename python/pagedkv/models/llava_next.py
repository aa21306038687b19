"""LLaVA-NeXT (LlavaNextForConditionalGeneration): LLaVA-1.5's CLIP tower and projector
(models/llava.py) on "anyres" tiles. HF's image processor cuts each image into a base view plus
the tiles of its best grid pinpoint; the tower runs on every view, and the tiles' features are
stitched back into one grid, cropped to the image's aspect ratio (unpadding) and given an
``image_newline`` row after each feature row. The rows per image, which depend on its size,
are counted by HF's LlavaNextProcessor; the tiling helpers are transformers' own.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import nn

from pagedkv.models.config import ModelConfig
from pagedkv.models.llava import LlavaForConditionalGeneration


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    """LLaVA with anyres tiling and the image_newline row."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        if self.hf_config.image_grid_pinpoints is None:
            raise ValueError("LLaVA-NeXT config.json has no image_grid_pinpoints")
        self.image_newline = nn.Parameter(torch.empty(cfg.hidden_size))

    @classmethod
    def hf_config_class(cls) -> Any:
        from transformers import LlavaNextConfig

        return LlavaNextConfig

    @classmethod
    def projector_class(cls) -> Any:
        from transformers.models.llava_next.modeling_llava_next import (
            LlavaNextMultiModalProjector,
        )

        return LlavaNextMultiModalProjector

    def image_inputs(
        self, processor: Any, images: Sequence[Any]
    ) -> Tuple[dict[str, torch.Tensor], List[int]]:
        """pixel_values [N, max views, 3, H, W] (padded to the image with most tiles) and
        image_sizes [N, 2] (height, width), as HF's processor makes them; the rows of each image
        counted by LlavaNextProcessor."""
        out = processor.image_processor(images=list(images), return_tensors="pt")
        sizes = out["image_sizes"]
        counts = processor._get_num_multimodal_tokens(image_sizes=sizes.tolist()).num_image_tokens
        return {"pixel_values": out["pixel_values"], "image_sizes": sizes}, list(counts)

    @torch.inference_mode()
    def encode_images(  # type: ignore[override]
        self, pixel_values: torch.Tensor, image_sizes: torch.Tensor
    ) -> torch.Tensor:
        """-> [rows of all images, hidden], image by image: the base view's patches, then the
        tiles' unpadded grid with an image_newline row after each of its rows."""
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        hf = self.hf_config
        sizes = [(int(h), int(w)) for h, w in image_sizes.tolist()]
        views = [
            image_size_to_num_patches(s, hf.image_grid_pinpoints, hf.vision_config.image_size)
            for s in sizes
        ]
        stacked = torch.cat([pv[:n] for pv, n in zip(pixel_values, views)])
        feats = self.image_features(stacked).split(views)
        return torch.cat([self._pack(f, s) for f, s in zip(feats, sizes)])

    def _pack(self, feats: torch.Tensor, size: Tuple[int, int]) -> torch.Tensor:
        """One image's views [views, patches, hidden] -> its rows (HF's pack_image_features)."""
        from transformers.models.llava_next.modeling_llava_next import (
            get_anyres_image_grid_shape,
            unpad_image,
        )

        hf = self.hf_config
        newline = self.image_newline.to(feats.dtype)
        if feats.shape[0] == 1:  # no tiles: the base view and one newline
            return torch.cat([feats[0], newline[None]])
        side = hf.vision_config.image_size // hf.vision_config.patch_size
        rows, cols = get_anyres_image_grid_shape(
            list(size), hf.image_grid_pinpoints, hf.vision_config.image_size
        )
        # tiles [rows, cols, side, side, hidden] -> one grid [hidden, rows*side, cols*side]
        grid = feats[1:].view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3)
        grid = unpad_image(grid.flatten(1, 2).flatten(2, 3), list(size))
        grid = torch.cat([grid, newline[:, None, None].expand(*grid.shape[:-1], 1)], dim=-1)
        return torch.cat([feats[0], grid.flatten(1, 2).transpose(0, 1)])

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        loaded_elsewhere: Optional[set[str]] = None,
    ) -> None:
        """LLaVA's tensors and ``image_newline`` (``model.image_newline`` in transformers 5)."""
        found: List[torch.Tensor] = []

        def rest() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name.removeprefix("model.") == "image_newline":
                    found.append(tensor)
                else:
                    yield name, tensor

        super().load_weights(rest(), (loaded_elsewhere or set()) | {"image_newline"})
        if len(found) != 1:
            raise ValueError("LLaVA-NeXT checkpoint: image_newline is missing")
        with torch.no_grad():
            self.image_newline.copy_(found[0])
