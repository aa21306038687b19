"""A checkpoint's generation_config.json as vLLM applies it (``--generation-config``): "auto"
reads the model's own file, "vllm" ignores it, any other value is a folder holding one. Its
sampling keys become the default SamplingParams; its eos ids stop generation too."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

# generation_config.json key -> SamplingParams field (vLLM's get_diff_sampling_param).
SAMPLING_KEYS = {
    "repetition_penalty": "repetition_penalty",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}
FILE = "generation_config.json"


def load_generation_config(mode: str, model_dir: Optional[str]) -> dict[str, Any]:
    """The generation config ``mode`` selects ({} for "vllm", or "auto" without a file)."""
    if not isinstance(mode, str) or not mode:
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {mode!r}")
    if mode == "vllm":
        return {}
    folder = model_dir if mode == "auto" else os.path.expanduser(mode)
    path = os.path.join(folder, FILE) if folder else ""
    if not path or not os.path.isfile(path):
        if mode == "auto":
            return {}  # most GGUF files and many checkpoints have none
        raise FileNotFoundError(f"generation_config={mode!r}: no {FILE} in that folder")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return config


def sampling_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams keyword arguments the generation config sets (None values skipped)."""
    return {ours: config[key] for key, ours in SAMPLING_KEYS.items() if config.get(key) is not None}


def eos_token_ids(config: dict[str, Any]) -> list[int]:
    eos = config.get("eos_token_id")
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(e) for e in eos]
