"""Quantized checkpoints: the method from config.json's ``quantization_config`` (or
``LLM(quantization=...)``), applied to the model's linear layers before the weights load.

    fp8   e4m3 weights with per-tensor or per-channel ``weight_scale`` (activation_scheme
          "dynamic"): torch._scaled_mm with per-token activation scales on GPUs with fp8 tensor
          cores (compute capability >= 8.9), weights dequantised at load elsewhere (CPU).
          ``LLM(quantization="fp8")`` on an unquantised checkpoint quantises its weights.
    awq   AutoAWQ "gemm" int4 (qweight/qzeros/scales, zero points)      } pagedkv.ops.int4_gemm
    gptq  AutoGPTQ int4 (desc_act=False, or a g_idx in plain order)     } (the core's kernel)

Anything else is refused by name; so are quantized MoE experts and tensor parallelism.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from pagedkv.models.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from pagedkv.models.quantization.fp8 import Fp8Method
from pagedkv.models.quantization.int4 import AwqMethod, GptqMethod
from pagedkv.models.quantization.layer import QuantLinear, QuantMethod

METHODS: dict[str, type[QuantMethod]] = {"fp8": Fp8Method, "awq": AwqMethod, "gptq": GptqMethod}
# Linear layers that stay unquantised whatever the method: MoE routers (checkpoints keep them
# in full precision).
_NEVER = (".gate", ".shared_expert_gate")

__all__ = ["METHODS", "QuantLinear", "QuantMethod", "resolve_quantization", "quantize_model",
           "finish_quantization"]


def resolve_quantization(hf_config: Optional[dict[str, Any]],
                         requested: Optional[str]) -> Optional[QuantMethod]:
    """The method a model loads with: the checkpoint's ``quantization_config``, which
    ``requested`` (LLM(quantization=...)) must agree with; "fp8" alone quantises an unquantised
    checkpoint at load. A method pagedkv does not implement raises, naming it."""
    if requested is not None and not isinstance(requested, str):
        raise TypeError(f"quantization must be a str, got {type(requested).__name__}")
    name = (hf_config or {}).get("quant_method")
    if name is not None and requested is not None and requested.lower() != str(name).lower():
        raise ValueError(f"quantization={requested!r} does not match the checkpoint's "
                         f"quantization_config (quant_method {name!r})")
    chosen = name if name is not None else requested
    if chosen is None:
        return None
    chosen = str(chosen).lower()
    if chosen not in METHODS:
        raise ValueError(f"quantization method {chosen!r} is not supported (supported: "
                         f"{', '.join(METHODS)})")
    if name is None and chosen != "fp8":
        raise ValueError(f"quantization={chosen!r} needs a checkpoint quantized with "
                         f"{chosen} (its config.json has no quantization_config)")
    return METHODS[chosen](hf_config or {"quant_method": "fp8", "online": True})


def quantize_model(model: nn.Module, method: QuantMethod) -> None:
    """Replaces the model's linear layers by QuantLinear (the method's parameters, named as
    the checkpoint's tensors) before the weights load."""
    from pagedkv.distributed import get_tp_group
    from pagedkv.models.moe import FusedMoE

    if get_tp_group().world_size > 1:
        raise ValueError(f"{method.name} quantization is not supported with tensor "
                         "parallelism yet")
    skip = tuple(method.modules_to_not_convert)
    for name, module in list(model.named_modules()):
        if isinstance(module, FusedMoE):
            raise ValueError(f"{method.name} quantization of MoE experts ({name}) is not "
                             "supported")
        if not isinstance(module, (ColumnParallelLinear, RowParallelLinear, ReplicatedLinear)):
            continue
        if name.endswith(_NEVER) or any(s and s in name for s in skip):
            continue
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, QuantLinear(method, module))


def finish_quantization(model: nn.Module) -> None:
    """After loading: each method's repacking / dequantisation for the model's device."""
    for module in model.modules():
        if isinstance(module, QuantLinear):
            module.method.finish(module)
