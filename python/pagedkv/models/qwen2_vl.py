"""Qwen2-VL (Qwen2VLForConditionalGeneration): transformers' own vision transformer (14-pixel
patches, 2 x 2 merged into one row of the language model's hidden size) in front of our Qwen2
(models/llama.py) with M-RoPE (models/mrotary.py).

An image is ``<|vision_start|><|image_pad|><|vision_end|>`` in the text; the pad becomes one
placeholder per merged patch (image_grid_thw.prod() // merge_size ** 2, Qwen2VLProcessor's
count). Positions: text tokens count up as usual; an image's rows take (temporal, height,
width) positions from where the text stopped, and the text after it resumes at that start +
max(grid height, grid width) (HF's get_rope_index). The prompt's positions are computed once
at admission (``mrope_positions``); every later token is at its index + delta, delta = max
prompt position + 1 - prompt length.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from pagedkv.models.config import ModelConfig
from pagedkv.models.llama import LlamaForCausalLM, Rope, rotary_dim
from pagedkv.models.mrotary import MRotaryEmbedding


class Qwen2VLForConditionalGeneration(LlamaForCausalLM):
    """Our Qwen2 with M-RoPE and the vision transformer beside it."""

    def __init__(self, cfg: ModelConfig) -> None:
        from transformers import Qwen2VLConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )

        super().__init__(cfg)
        hf: Any = Qwen2VLConfig(**cfg.extra["multimodal"])
        self.hf_config = hf
        section = cfg.extra.get("mrope_section")
        if section is None:
            raise ValueError("Qwen2-VL config.json has no mrope_section in its rope parameters")
        self.model.rotary = MRotaryEmbedding(
            section,
            cfg.head_dim,
            cfg.max_position_embeddings,
            cfg.rope_theta,
            cfg.rope_scaling,
            rotary_dim(cfg),
        )
        self.image_token_id = int(hf.image_token_id)
        self.vision_start_token_id = int(hf.vision_start_token_id)
        self.vision_end_token_id = int(hf.vision_end_token_id)
        self.merge_size = int(hf.vision_config.spatial_merge_size)
        self.visual = Qwen2VisionTransformerPretrainedModel(hf.vision_config)

    def layer_ropes(self, positions: torch.Tensor) -> Callable[[nn.Module], Rope]:
        """One rotary for every layer, its M-RoPE table gathered once per step."""
        rope = self.model.rotary.bind(positions)
        return lambda _: rope

    # ------------------------------------------------------------------ image inputs
    @staticmethod
    def load_image_processor(folder: str) -> Any:
        """The checkpoint's Qwen2VLImageProcessor (Qwen2VLProcessor would also load a video
        processor, which needs torchvision; pagedkv takes images only)."""
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(folder)

    def image_inputs(
        self, processor: Any, images: Sequence[Any]
    ) -> Tuple[dict[str, torch.Tensor], List[int]]:
        """pixel_values [patches, C * temporal * patch * patch] and image_grid_thw [N, 3]; the
        rows of an image are its patches over merge_size ** 2 (as Qwen2VLProcessor counts)."""
        out = processor(images=list(images), return_tensors="pt")
        grid = out["image_grid_thw"]
        counts = (grid.prod(-1) // int(processor.merge_size) ** 2).tolist()
        return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}, counts

    def chat_image_ids(self) -> List[int]:
        return [self.vision_start_token_id, self.image_token_id, self.vision_end_token_id]

    @torch.inference_mode()
    def encode_images(
        self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor
    ) -> torch.Tensor:
        """-> [merged patches of all images, hidden], image by image."""
        dtype = self.visual.get_dtype()
        out = self.visual(pixel_values.to(dtype), grid_thw=image_grid_thw)
        # (transformers 5 returns a model output with the merged rows as pooler_output)
        return getattr(out, "pooler_output", out)

    def mrope_positions(
        self, ids: np.ndarray, inputs: dict[str, torch.Tensor]
    ) -> Tuple[np.ndarray, int]:
        """The prompt's positions [3, len(ids)] and the delta of every later position."""
        grids = inputs["image_grid_thw"].tolist()
        placeholders = np.flatnonzero(ids == self.image_token_id)
        out = np.empty((3, len(ids)), dtype=np.int64)
        pos = i = used = 0  # next text position, next prompt index, placeholders taken
        for t, h, w in grids:
            gh, gw = h // self.merge_size, w // self.merge_size
            n = t * gh * gw
            rows = placeholders[used : used + n]
            if len(rows) != n or rows[-1] - rows[0] != n - 1:
                raise ValueError("an image's placeholder tokens must be contiguous")
            first = int(rows[0])
            out[:, i:first] = pos + np.arange(first - i)  # the text before the image
            pos += first - i
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            out[:, first : first + n] = pos + np.stack([tt, hh, ww]).reshape(3, n)
            pos += max(gh, gw)
            i, used = first + n, used + n
        out[:, i:] = pos + np.arange(len(ids) - i)
        return out, int(out.max()) + 1 - len(ids)

    # ------------------------------------------------------------------ weights
    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        loaded_elsewhere: Optional[set[str]] = None,
    ) -> None:
        """Both layouts: transformers 4 (``visual.*``, ``model.layers.*``) and 5
        (``model.visual.*``, ``model.language_model.*``). Vision tensors go to the HF module,
        the rest to Qwen2."""
        vision: dict[str, torch.Tensor] = {}

        def language() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                bare = name.removeprefix("model.")
                if bare.startswith("visual."):
                    vision[bare.removeprefix("visual.")] = tensor
                elif bare.startswith("language_model."):
                    yield "model." + bare.removeprefix("language_model."), tensor
                else:
                    yield name, tensor

        own = {n for n, _ in self.named_parameters() if n.startswith("visual.")}
        super().load_weights(language(), (loaded_elsewhere or set()) | own)
        # A missing or unexpected vision tensor is an error, never a random weight.
        self.visual.load_state_dict(vision, strict=True)
