"""LLaVA-1.5 (LlavaForConditionalGeneration): a CLIP vision tower and a 2-layer MLP projector,
run by transformers' own modules, in front of our Llama (models/llama.py) as the language model.

The vision side runs once per request (engine/multimodal.py): ``encode_images`` turns pixel
values into one row of the language model's hidden size per image token. The language model then
runs on the paged KV cache like any Llama, from ``inputs_embeds`` where a step holds image rows.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple

import torch

from pagedkv.models.config import ModelConfig
from pagedkv.models.llama import LlamaForCausalLM


def num_image_tokens(hf: Any) -> int:
    """Rows one image becomes: one per patch, plus CLS under the "full" strategy (as HF's
    LlavaProcessor counts them)."""
    vc = hf.vision_config
    patches = (vc.image_size // vc.patch_size) ** 2
    return patches + (1 if hf.vision_feature_select_strategy == "full" else 0)


class LlavaForConditionalGeneration(LlamaForCausalLM):
    """Our Llama with the vision tower and projector beside it."""

    def __init__(self, cfg: ModelConfig) -> None:
        from transformers import CLIPVisionModel

        super().__init__(cfg)
        hf = self.hf_config = self.hf_config_class()(**cfg.extra["multimodal"])
        if hf.vision_config.model_type != "clip_vision_model":
            raise ValueError(
                f"LLaVA vision tower {hf.vision_config.model_type!r} is not supported "
                "(pagedkv runs CLIP vision towers: LLaVA-1.5)"
            )
        self.image_token_id = int(hf.image_token_index)
        self.image_seq_length = num_image_tokens(hf)
        self.vision_tower = CLIPVisionModel(hf.vision_config)
        self.multi_modal_projector = self.projector_class()(hf)

    @classmethod
    def hf_config_class(cls) -> Any:
        """transformers' config class of the checkpoint (LLaVA-NeXT: LlavaNextConfig)."""
        from transformers import LlavaConfig

        return LlavaConfig

    @classmethod
    def projector_class(cls) -> Any:
        from transformers.models.llava.modeling_llava import LlavaMultiModalProjector

        return LlavaMultiModalProjector

    def image_inputs(
        self, processor: Any, images: Sequence[Any]
    ) -> Tuple[dict[str, torch.Tensor], List[int]]:
        """The image processor's pixel values [N, 3, H, W]; image_seq_length rows each."""
        pixels = processor.image_processor(images=list(images), return_tensors="pt")
        return {"pixel_values": pixels["pixel_values"]}, [self.image_seq_length] * len(images)

    @staticmethod
    def load_image_processor(folder: str) -> Any:
        """The checkpoint's HF processor (LlavaProcessor / LlavaNextProcessor)."""
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)

    def chat_image_ids(self) -> List[int]:
        return [self.image_token_id]

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N, patches, hidden]: the vision tower's hidden states of
        vision_feature_layer(s), CLS dropped under the "default" strategy, projected."""
        hf = self.hf_config
        dtype = self.multi_modal_projector.linear_1.weight.dtype
        out = self.vision_tower(pixel_values.to(dtype), output_hidden_states=True)
        layers = hf.vision_feature_layer
        picked = [out.hidden_states[i] for i in ([layers] if isinstance(layers, int) else layers)]
        if hf.vision_feature_select_strategy == "default":
            picked = [h[:, 1:] for h in picked]
        return self.multi_modal_projector(torch.cat(picked, dim=-1))

    @torch.inference_mode()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] -> [N * image_seq_length, hidden]."""
        feats = self.image_features(pixel_values)
        return feats.reshape(-1, feats.shape[-1])

    def load_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]],
        loaded_elsewhere: Optional[set[str]] = None,
    ) -> None:
        """Both checkpoint layouts: transformers 4 / llava-hf (``language_model.model.*``,
        ``vision_tower.vision_model.*``) and transformers 5 (``model.language_model.*``,
        ``model.vision_tower.*``). Vision tensors go to the HF modules, the rest to Llama."""
        vision: dict[str, torch.Tensor] = {}
        projector: dict[str, torch.Tensor] = {}

        def language() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                name = name.removeprefix("model.") if name.startswith("model.") else name
                if name.startswith("vision_tower."):
                    key = name.removeprefix("vision_tower.").removeprefix("vision_model.")
                    vision[key] = tensor
                elif name.startswith("multi_modal_projector."):
                    projector[name.removeprefix("multi_modal_projector.")] = tensor
                elif name.startswith("language_model."):
                    rest = name.removeprefix("language_model.")
                    # transformers 5 drops the inner "model." of the language model.
                    if not rest.startswith(("model.", "lm_head.")):
                        rest = "model." + rest
                    yield rest, tensor
                else:  # lm_head.weight (transformers 5)
                    yield name, tensor

        # The vision side is loaded below, from what the pass over the tensors set aside.
        own = {n for n, _ in self.named_parameters() if n.startswith(("vision_tower.", "multi_"))}
        super().load_weights(language(), (loaded_elsewhere or set()) | own)
        # A missing or unexpected vision tensor is an error, never a random weight.
        # (transformers 4's CLIPVisionModel nests its modules under .vision_model; 5's does not)
        tower = getattr(self.vision_tower, "vision_model", self.vision_tower)
        got = tower.load_state_dict(
            {k: v for k, v in vision.items() if not k.endswith("position_ids")}, strict=False
        )
        missing = [k for k in got.missing_keys if not k.endswith("position_ids")]
        if missing or got.unexpected_keys:
            raise ValueError(
                f"vision_tower tensors do not match the config: missing {missing[:5]}, "
                f"unexpected {got.unexpected_keys[:5]}"
            )
        self.multi_modal_projector.load_state_dict(projector, strict=True)
