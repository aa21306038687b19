"""M-RoPE (Qwen2-VL's multimodal rotary): each token has three positions (temporal, height,
width); the rotary's frequencies are split into ``mrope_section`` bands and band i turns by
position component i % 3. Text tokens carry three equal positions, which makes it plain rope:
a step whose positions are [T] takes the plain path (fused op, CUDA graphs); one with [3, T]
positions gathers each token's cos | sin row from the three components and rotates through the
same fused op, over a per-step table (positions 0..T-1 into it, gathered once per step for
all layers: ``bind``), as dynamic NTK does.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional, Sequence

import torch

from pagedkv import ops
from pagedkv.models.rotary import _FUSED_DTYPES, RotaryEmbedding, apply_rotary


class MRotaryEmbedding(RotaryEmbedding):
    def __init__(self, section: Sequence[int], *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if sum(section) != self.rotary_dim // 2:
            raise ValueError(
                f"mrope_section {list(section)} must add up to rotary_dim / 2 = "
                f"{self.rotary_dim // 2}"
            )
        # The position component (0 temporal, 1 height, 2 width) of each frequency.
        self.component = torch.cat(
            [torch.full((n,), i % 3, dtype=torch.int64) for i, n in enumerate(section)]
        )

    def mrope_cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [3, T] -> float32 cos and sin [T, rotary_dim / 2], frequency j taken at
        position component ``component[j]``."""
        comps = [self.cos_sin(positions[c]) for c in range(3)]
        cos = torch.stack([c for c, _ in comps])  # [3, T, rotary_dim / 2]
        sin = torch.stack([s for _, s in comps])
        if self.component.device != cos.device:
            self.component = self.component.to(cos.device)
        pick = self.component[None, None, :].expand(1, *cos.shape[1:])
        return cos.gather(0, pick)[0], sin.gather(0, pick)[0]

    def bind(self, positions: torch.Tensor) -> Callable[..., object]:
        """The rotary of a step, for every layer: plain rope for [T] positions; for [3, T] the
        step's cos | sin table, gathered at the first layer and reused by the others."""
        if positions.dim() == 1:
            return partial(self.forward, positions)
        made: dict[torch.dtype, Callable[..., object]] = {}

        def rope(q: torch.Tensor, k: Optional[torch.Tensor]) -> None:
            if q.dtype not in made:
                made[q.dtype] = self._step_rotation(positions, q.dtype)
            made[q.dtype](q, k)

        return rope

    def _step_rotation(self, positions: torch.Tensor, dtype: torch.dtype) -> Callable[..., object]:
        cos, sin = self.mrope_cos_sin(positions)
        if dtype not in _FUSED_DTYPES:

            def eager(q: torch.Tensor, k: Optional[torch.Tensor]) -> None:
                q.copy_(apply_rotary(q, cos, sin, self.rotary_dim, self.is_neox))
                if k is not None:
                    k.copy_(apply_rotary(k, cos, sin, self.rotary_dim, self.is_neox))

            return eager
        table = torch.cat([cos, sin], dim=1).to(dtype).contiguous()
        rows = torch.arange(table.shape[0], device=table.device)
        return partial(self._rotate, rows, table)

    def _rotate(
        self, rows: torch.Tensor, table: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor]
    ) -> None:
        ops.rotary_embedding(rows, q, k, self.head_dim, table, self.is_neox)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if positions.dim() == 1:
            return super().forward(positions, q, k)
        self._step_rotation(positions, q.dtype)(q, k)
        return q, k
