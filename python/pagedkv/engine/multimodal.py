"""Multimodal inputs: the one place that says which modalities pagedkv's models take.

No model here has a vision or audio encoder yet, so an image, audio or video input is refused
by name (a ValueError; 400 in the server) instead of being dropped and the text answered as if
the image had never been sent. A model that gains an encoder lists its modalities in
``SUPPORTED_MODALITIES``.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, Mapping, Optional

# Architecture name -> the modalities its prompts may carry besides text.
SUPPORTED_MODALITIES: Dict[str, FrozenSet[str]] = {}

# vLLM's prompt-dict keys that carry or configure non-text inputs.
MULTIMODAL_PROMPT_KEYS = ("multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids")

# OpenAI / vLLM chat content-part types -> the modality they carry.
CHAT_PART_MODALITIES = {
    "image_url": "image",
    "image_embeds": "image",
    "image_pil": "image",
    "input_image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "video_url": "video",
    "file": "file",
    "input_file": "file",
}


class UnsupportedModalityError(ValueError):
    """An input of a modality the loaded model cannot read."""


def model_modalities(architecture: Optional[str]) -> FrozenSet[str]:
    return SUPPORTED_MODALITIES.get(architecture or "", frozenset())


def _refusal(where: str, modality: str, architecture: Optional[str]) -> UnsupportedModalityError:
    model = f"the model ({architecture})" if architecture else "the model"
    return UnsupportedModalityError(
        f"{where}: {modality} inputs are not supported: {model} takes text only "
        f"(pagedkv has no {modality} encoder for it)"
    )


def check_prompt_modalities(
    item: Mapping[str, Any], name: str, architecture: Optional[str] = None
) -> None:
    """Refuses a prompt dict's ``multi_modal_data`` (and its companion keys) unless the model
    reads every modality it holds."""
    supported = model_modalities(architecture)
    data = item.get("multi_modal_data")
    if data is not None:
        if not isinstance(data, Mapping):
            raise TypeError(
                f"{name}['multi_modal_data'] must be a dict of modality -> data, "
                f"got {type(data).__name__}"
            )
        for modality in data:
            if modality not in supported:
                raise _refusal(
                    f"{name}['multi_modal_data'][{modality!r}]", str(modality), architecture
                )
    for key in MULTIMODAL_PROMPT_KEYS:
        if key in item and item[key] is not None and not supported:
            raise _refusal(f"{name}[{key!r}]", "multimodal", architecture)


def check_chat_part(part_type: Any, where: str, architecture: Optional[str] = None) -> None:
    """Refuses a chat content part of a modality the model cannot read (by name); text parts
    and unknown types are the caller's to judge."""
    modality = CHAT_PART_MODALITIES.get(part_type) if isinstance(part_type, str) else None
    if modality is not None and modality not in model_modalities(architecture):
        raise _refusal(f"{where} (type {part_type!r})", modality, architecture)
