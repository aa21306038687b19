"""QuantLinear: a linear layer whose weight is stored by a quantization method.

It takes the place of a Column/Row/Replicated linear layer of the model, keeps that layer's
bias and its checkpoint loader (which places each fused part, q/k/v or gate/up, at its rows),
and holds the method's parameters under the checkpoint's tensor names (``weight`` +
``weight_scale``, or ``qweight`` / ``qzeros`` / ``scales`` / ``g_idx``). Each parameter's
``weight_loader`` converts a checkpoint tensor to the layout the method computes with, then
hands it to the original loader.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn

Loader = Callable[..., None]


class QuantMethod:
    """One quantization format: creates a layer's parameters, finishes them after loading and
    computes the layer's output."""

    name = ""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.modules_to_not_convert: list[str] = list(
            config.get("modules_to_not_convert") or config.get("ignored_layers") or [])

    def create(self, layer: QuantLinear, base: nn.Module, loader: Loader) -> None:
        raise NotImplementedError

    def finish(self, layer: QuantLinear) -> None:
        """Called once every tensor is loaded (repacking, dequantisation)."""

    def apply(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def shard_rows(base: nn.Module, shard: Any) -> int:
    """Output rows of one checkpoint tensor of ``base``: a q/k/v or gate/up part, or all."""
    from pagedkv.models.linear import MergedColumnParallelLinear, QKVParallelLinear

    if isinstance(base, QKVParallelLinear) and shard is not None:
        idx = {"q": 0, "k": 1, "v": 2}.get(shard, shard) if isinstance(shard, str) else shard
        heads = base.total_num_heads if int(idx) == 0 else base.total_num_kv_heads
        return heads * base.head_dim
    if isinstance(base, MergedColumnParallelLinear) and shard is not None:
        return base.output_sizes[int(shard)]
    return int(getattr(base, "output_size", base.weight.shape[0]))


class QuantLinear(nn.Module):
    def __init__(self, method: QuantMethod, base: nn.Module) -> None:
        super().__init__()
        self.method = method
        self.out_features, self.in_features = (int(s) for s in base.weight.shape)
        self.dtype, self.device = base.weight.dtype, base.weight.device
        self.bias: Optional[nn.Parameter] = base.bias
        self.base_name = type(base).__name__
        method.create(self, base, base.weight.weight_loader)

    def add(self, name: str, tensor: torch.Tensor, loader: Loader) -> nn.Parameter:
        """Registers parameter ``name`` (``tensor`` on the layer's device) with its loader."""
        param = nn.Parameter(tensor.to(self.device), requires_grad=False)
        param.weight_loader = loader  # type: ignore[attr-defined]
        self.register_parameter(name, param)
        return param

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.method.apply(self, x)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return (f"{self.method.name}, in={self.in_features}, out={self.out_features}, "
                f"replaces {self.base_name}")
