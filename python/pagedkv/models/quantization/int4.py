"""AWQ and GPTQ int4 checkpoints, repacked on loading into the layout of pagedkv.ops.int4_gemm:
``qweight`` [N, K / 2] uint8 (two codes per byte, even k in the low nibble), ``qzeros``
[N, K / G] uint8 and ``scales`` [N, K / G], i.e. W[n, k] = (q - zero) * scale of k's group.

Checkpoint layouts (W is [N out, K in]; int32 words hold 8 nibbles, nibble i = bits 4i..4i+3):
  AWQ (AutoAWQ "gemm"): qweight [K, N / 8] and qzeros [K / G, N / 8], packed along N with
      nibble i holding column 8j + (0, 2, 4, 6, 1, 3, 5, 7)[i]; scales [K / G, N].
  GPTQ (AutoGPTQ):      qweight [K / 8, N] packed along K (nibble i of row j: k = 8j + i);
      qzeros [K / G, N / 8] packed along N in order, storing zero - 1 (checkpoint_format
      "gptq"; "gptq_v2" stores the zero itself); scales [K / G, N]; g_idx [K], which must be
      k // G (desc_act=True reorders K and is refused).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from pagedkv import ops
from pagedkv.models.quantization.layer import Loader, QuantLinear, QuantMethod

_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_int32(t: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))
                 ) -> torch.Tensor:
    """int32 words -> their 8 nibbles along ``dim`` (nibble i -> position order[i] of the 8)."""
    t = t.to(torch.int32)
    nibbles = torch.stack([(t >> (4 * i)) & 0xF for i in range(8)], dim=-1)  # [..., 8]
    nibbles = nibbles[..., [order.index(p) for p in range(8)]]  # position p <- its nibble
    if dim in (0, -t.dim()):
        nibbles = nibbles.movedim(-1, 1)  # [R, 8, C]: rows 8r .. 8r + 7
        return nibbles.reshape(t.shape[0] * 8, t.shape[1]).to(torch.uint8)
    return nibbles.reshape(t.shape[0], t.shape[1] * 8).to(torch.uint8)


def pack_pairs(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes (0..15) -> [N, K / 2] bytes, even k in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).contiguous()


class Int4Method(QuantMethod):
    """What AWQ and GPTQ share: parameters, group size, the forward through the core's GEMM."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        bits = int(config.get("bits", config.get("w_bit", 4)))
        if bits != 4:
            raise ValueError(f"{self.name} with bits={bits} is not supported (only 4-bit)")
        self.group_size = int(config.get("group_size", config.get("q_group_size", 128)))

    def group(self, layer: QuantLinear) -> int:
        g = layer.in_features if self.group_size == -1 else self.group_size
        if g <= 0 or g % 2 or layer.in_features % g:
            raise ValueError(f"{self.name}: group_size {self.group_size} does not divide the "
                             f"{layer.in_features} inputs of a layer into even groups")
        return g

    # Checkpoint tensor -> the GEMM's layout, one converter per parameter.
    def converters(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        raise NotImplementedError

    def create(self, layer: QuantLinear, base: nn.Module, loader: Loader) -> None:
        n, k = layer.out_features, layer.in_features
        groups = k // self.group(layer)
        shapes = {"qweight": (n, k // 2, torch.uint8), "qzeros": (n, groups, torch.uint8),
                  "scales": (n, groups, layer.dtype)}
        convert = self.converters()
        for name, (rows, cols, dtype) in shapes.items():
            def load(param: torch.Tensor, loaded: torch.Tensor, shard: Any = None,
                     name: str = name) -> None:
                loader(param, convert[name](loaded), shard)

            layer.add(name, torch.empty(rows, cols, dtype=dtype), load)

    def apply(self, layer: QuantLinear, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = ops.int4_gemm(x.reshape(-1, shape[-1]).contiguous(), layer.qweight, layer.scales,
                          layer.qzeros, self.group(layer))
        return y.reshape(*shape[:-1], -1)


class AwqMethod(Int4Method):
    name = "awq"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"awq version {version!r} is not supported (only 'gemm')")
        if not config.get("zero_point", True):
            raise ValueError("awq without zero points (zero_point=false) is not supported")

    def converters(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        return {"qweight": lambda t: pack_pairs(unpack_int32(t, 1, _AWQ_ORDER).t()),
                "qzeros": lambda t: unpack_int32(t, 1, _AWQ_ORDER).t().contiguous(),
                "scales": lambda t: t.t().contiguous()}


class GptqMethod(Int4Method):
    name = "gptq"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        fmt = str(config.get("checkpoint_format", "gptq")).lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq checkpoint_format {fmt!r} is not supported")
        self.zero_offset = 1 if fmt == "gptq" else 0  # v1 stores zero - 1
        # desc_act=True is accepted as long as every g_idx is in plain order (checked on load).

    def converters(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        off = self.zero_offset
        return {"qweight": lambda t: pack_pairs(unpack_int32(t, 0).t()),
                "qzeros": lambda t: ((unpack_int32(t, 1) + off) & 0xF).t().contiguous(),
                "scales": lambda t: t.t().contiguous()}

    def create(self, layer: QuantLinear, base: nn.Module, loader: Loader) -> None:
        super().create(layer, base, loader)
        g, k = self.group(layer), layer.in_features

        def load_g_idx(param: torch.Tensor, loaded: torch.Tensor, shard: Any = None) -> None:
            plain = torch.arange(k, dtype=torch.int64) // g
            if loaded.shape != (k,) or not torch.equal(loaded.to(torch.int64).cpu(), plain):
                raise ValueError("is a g_idx that reorders the inputs (desc_act=True), which "
                                 "is not supported")
            param.data.copy_(loaded.to(param.dtype))

        layer.add("g_idx", torch.empty(k, dtype=torch.int32), load_g_idx)
