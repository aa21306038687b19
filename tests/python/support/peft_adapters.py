"""Random PEFT LoRA adapters of a saved checkpoint, written by peft itself (the LoRA tests'
independent reference format)."""

from __future__ import annotations

from typing import List, Optional

from support.deps import need


def save_peft_adapter(
    base: str,
    out: str,
    targets: List[str],
    seed: int,
    rank: int = 4,
    lora_alpha: Optional[int] = None,
) -> str:
    """Writes a LoRA adapter of ``base`` over ``targets`` with random A and B (seeded by
    ``seed``; ``lora_alpha`` 2 x rank unless given) to ``out``; returns ``out``."""
    torch = need("torch")
    transformers = need("transformers")
    peft = need("peft")

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    alpha = 2 * rank if lora_alpha is None else lora_alpha
    cfg = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    peft.get_peft_model(model, cfg).save_pretrained(out)
    return out
