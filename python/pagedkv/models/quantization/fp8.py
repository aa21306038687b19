"""fp8 (e4m3) weights with a per-tensor or per-channel ``weight_scale``.

Stored as the checkpoint has them, [N, K] float8_e4m3fn, with the scale kept per output row
(a per-tensor scale is repeated over its part's rows, so fused q/k/v or gate/up parts may each
have their own). On a GPU with fp8 tensor cores (compute capability >= 8.9) and bf16
activations the layer runs torch._scaled_mm on activations quantised per token (dynamic, the
checkpoint's activation_scheme); elsewhere the weight is dequantised once after loading.
``LLM(quantization="fp8")`` on an unquantised checkpoint quantises each weight per channel.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pagedkv.models.quantization.layer import Loader, QuantLinear, QuantMethod, shard_rows

FP8 = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8).max)  # 448


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], scale [N, 1] float32) with w ~ q * scale."""
    scale = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (w.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def use_scaled_mm(device: torch.device, dtype: torch.dtype, n: int, k: int) -> bool:
    """torch._scaled_mm's rowwise-scaled path: fp8 tensor cores, bf16 output, dims % 16."""
    return (device.type == "cuda" and dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0
            and torch.cuda.get_device_capability(device) >= (8, 9)
            and hasattr(torch, "_scaled_mm"))


class Fp8Method(QuantMethod):
    name = "fp8"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.online = bool(config.get("online"))
        if config.get("weight_block_size"):
            raise ValueError("fp8 checkpoints with block-wise scales (weight_block_size = "
                             f"{config['weight_block_size']}) are not supported")
        scheme = config.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ValueError(f"fp8 activation_scheme {scheme!r} is not supported (only "
                             "'dynamic': activations are scaled per token at run time)")

    def create(self, layer: QuantLinear, base: nn.Module, loader: Loader) -> None:
        n, k = layer.out_features, layer.in_features
        layer.scaled_mm = False  # decided by finish() once the weights are on their device
        weight = torch.empty(n, k, dtype=layer.dtype if self.online else FP8)
        layer.add("weight", weight, loader)
        if self.online:  # quantised in finish()
            return

        def load_scale(param: torch.Tensor, loaded: torch.Tensor, shard: Any = None) -> None:
            scale = loaded.float().reshape(-1, 1)
            if scale.numel() == 1:  # per tensor: the same scale on each of the part's rows
                scale = scale.expand(shard_rows(base, shard), 1)
            loader(param, scale, shard)

        layer.add("weight_scale", torch.empty(n, 1, dtype=torch.float32), load_scale)

    def finish(self, layer: QuantLinear) -> None:
        if self.online:
            w, scale = quantize_per_channel(layer.weight.data)
            layer.weight = nn.Parameter(w, requires_grad=False)
            layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        layer.scaled_mm = use_scaled_mm(layer.device, layer.dtype, layer.out_features,
                                        layer.in_features)
        if not layer.scaled_mm:  # dequantise once: from now on a plain linear layer
            w = (layer.weight.data.float() * layer.weight_scale.data).to(layer.dtype)
            layer.weight = nn.Parameter(w, requires_grad=False)
        else:  # _scaled_mm wants the weight scale as a row [1, N]
            layer.weight_scale = nn.Parameter(layer.weight_scale.data.reshape(1, -1).contiguous(),
                                              requires_grad=False)

    def apply(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        if not layer.scaled_mm:
            return F.linear(x, layer.weight)
        shape = x.shape
        xf = x.reshape(-1, shape[-1]).float()
        x_scale = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
        xq = (xf / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
        y = torch._scaled_mm(xq, layer.weight.t(), scale_a=x_scale, scale_b=layer.weight_scale,
                             out_dtype=layer.dtype)
        return y.reshape(*shape[:-1], -1)
