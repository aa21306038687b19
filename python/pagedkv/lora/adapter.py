"""A PEFT LoRA adapter folder read into per-module (A, B) pairs, the scaling folded into B.

Supported: ``adapter_config.json`` with ``r``, ``lora_alpha``, ``use_rslora``, ``target_modules``
over the linear projections, ``bias: "none"``, weights in ``adapter_model.safetensors`` or
``adapter_model.bin``. Everything else PEFT can save (embedding adapters, modules_to_save, DoRA,
per-module rank / alpha patterns, bias training) is refused by name.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field

import torch

_PREFIX = "base_model.model."


@dataclass
class LoRAAdapter:
    """``weights[module] = (A [r, in], B [out, r] * scaling)``, module as named in the base
    checkpoint (``model.layers.0.self_attn.q_proj``)."""

    rank: int
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def _read_config(path: str) -> dict:
    cfg_path = os.path.join(path, "adapter_config.json")
    if not os.path.isfile(cfg_path):
        raise ValueError(
            f"LoRA adapter {path!r}: no adapter_config.json (not a PEFT adapter folder)"
        )
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("peft_type", "LORA") != "LORA":
        raise ValueError(
            f"LoRA adapter {path!r}: peft_type {cfg.get('peft_type')!r} is not "
            "supported (only LORA)"
        )
    refused = {
        "use_dora": "DoRA adapters",
        "modules_to_save": "modules_to_save (fully trained extra modules)",
        "rank_pattern": "per-module ranks (rank_pattern)",
        "alpha_pattern": "per-module alphas (alpha_pattern)",
        "layers_to_transform": "layers_to_transform",
    }
    for key, what in refused.items():
        if cfg.get(key):
            raise ValueError(f"LoRA adapter {path!r}: {what} are not supported")
    if cfg.get("bias", "none") != "none":
        raise ValueError(
            f"LoRA adapter {path!r}: bias={cfg['bias']!r} is not supported (only 'none')"
        )
    return cfg


def _read_weights(path: str) -> dict[str, torch.Tensor]:
    st = os.path.join(path, "adapter_model.safetensors")
    if os.path.isfile(st):
        from safetensors.torch import load_file

        return load_file(st)
    pt = os.path.join(path, "adapter_model.bin")
    if os.path.isfile(pt):
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise ValueError(f"LoRA adapter {path!r}: no adapter_model.safetensors or adapter_model.bin")


def load_adapter(path: str, max_rank: int) -> LoRAAdapter:
    """Reads the PEFT adapter folder ``path``; its rank must be at most ``max_rank``."""
    cfg = _read_config(path)
    rank = int(cfg["r"])
    if rank < 1 or rank > max_rank:
        raise ValueError(f"LoRA adapter {path!r} has rank {rank}, but max_lora_rank is {max_rank}")
    alpha = float(cfg.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read_weights(path).items():
        name = key[len(_PREFIX) :] if key.startswith(_PREFIX) else key
        if "lora_embedding_" in name:
            raise ValueError(f"LoRA adapter {path!r}: embedding adapters ({key}) are not supported")
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:  # "<module>.lora_A.weight" or "<module>.lora_A.default.weight"
                pairs.setdefault(name.split(marker)[0], {})[part] = tensor
                break
        else:
            raise ValueError(f"LoRA adapter {path!r}: tensor {key!r} is not a LoRA A/B matrix")
    adapter = LoRAAdapter(rank)
    for module, ab in pairs.items():
        if set(ab) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter {path!r}: {module} lacks its lora_A or lora_B")
        a, b = ab["lora_A"].float(), ab["lora_B"].float()
        if a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(
                f"LoRA adapter {path!r}: {module} has A {tuple(a.shape)} and B "
                f"{tuple(b.shape)}, not of rank {rank}"
            )
        adapter.weights[module] = (a, b * scaling)
    return adapter
