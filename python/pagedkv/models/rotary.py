"""Rotary position embedding (NeoX / rotate-half or GPT-J / interleaved pairs, partial rotary)
with the llama3, linear, dynamic-NTK, YaRN and LongRoPE frequency scalings.

The frequencies (all the scaling math) are computed here once; the rotation itself is the fused
``pagedkv.ops.rotary_embedding`` op over a [max_position, rotary_dim] cos | sin table in the
model's dtype, in place on q and k. ``cos_sin`` / ``apply_rotary`` keep the eager formula: the
fallback for dtypes the op refuses, and the reference of the tests.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from pagedkv import ops

# dtypes the fused op takes; anything else (float64) rotates with the eager formula.
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _base_inv_freq(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are interpolated by `factor`, short ones kept, the band between blended.
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    dim: int, base: float, s: dict[str, Any], max_pos: int
) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    orig = s.get("original_max_position_embeddings") or max_pos
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attn_factor = _yarn_mscale(factor, s["mscale"]) / _yarn_mscale(
                factor, s["mscale_all_dim"]
            )
        else:
            attn_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation_weight = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (
        1.0 / pos_freqs
    ) * extrapolation_weight
    return inv_freq, float(attn_factor)


def _longrope(
    dim: int, base: float, s: dict[str, Any], max_pos: int
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """LongRoPE (Phi-3): per-frequency short / long factors, the long ones once a sequence passes
    original_max_position_embeddings; attention factor sqrt(1 + ln(factor) / ln(original))."""
    orig = s.get("original_max_position_embeddings") or max_pos
    factor = s.get("factor") or max_pos / orig
    attn = s.get("attention_factor")
    if attn is None:
        attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def inv(factors: Any) -> torch.Tensor:
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**shape)

    return inv(s["short_factor"]), inv(s["long_factor"]), float(attn), int(orig)


class RotaryEmbedding(nn.Module):
    """Holds a cos/sin table grown on demand; ``forward`` rotates q and k in place.

    rotary_dim (default head_dim): only the first rotary_dim dims of each head rotate (partial
    rotary, e.g. GPT-NeoX / Phi); the frequencies are those of a rotary_dim-wide rotation.
    is_neox: pairs (i, i + rotary_dim / 2) as HF's rotate_half; False: GPT-J's (2i, 2i + 1).
    """

    def __init__(
        self,
        head_dim: int,
        max_position: int,
        base: float,
        scaling: Optional[dict[str, Any]] = None,
        rotary_dim: Optional[int] = None,
        is_neox: bool = True,
    ) -> None:
        super().__init__()
        self.head_dim, self.max_position, self.base = head_dim, max_position, base
        self.long_inv_freq: Optional[torch.Tensor] = None  # LongRoPE's long factors
        self.original_max = 0
        self.rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if self.rotary_dim % 2 or not 2 <= self.rotary_dim <= head_dim:
            raise ValueError(
                f"rotary_dim = {self.rotary_dim} must be even and in [2, head_dim = {head_dim}]"
            )
        self.is_neox = is_neox
        dim = self.rotary_dim
        self.scaling: dict[str, Any] = dict(scaling) if scaling else {}
        rope_type = self.scaling["rope_type"] if self.scaling else "default"
        self.rope_type = rope_type
        self.attention_factor = 1.0
        with torch.device("cpu"):  # also when the model is built under torch.device("meta")
            inv_freq = _base_inv_freq(dim, base)
            if rope_type == "linear":
                inv_freq = inv_freq / self.scaling["factor"]
            elif rope_type == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, self.scaling)
            elif rope_type == "freq_factors":  # GGUF rope_freqs tensor (llama.cpp's form)
                inv_freq = inv_freq / torch.tensor(self.scaling["factors"], dtype=torch.float32)
            elif rope_type == "yarn":
                inv_freq, self.attention_factor = _yarn_inv_freq(
                    dim, base, self.scaling, max_position
                )
            elif rope_type == "longrope":
                inv_freq, self.long_inv_freq, self.attention_factor, self.original_max = _longrope(
                    dim, base, self.scaling, max_position
                )
        self.inv_freq = inv_freq  # [rotary_dim / 2] float32, CPU
        # Tables over positions [0, covered): [rows, 2, rotary_dim / 2] float32, and the op's
        # [rows, rotary_dim] cos | sin in its dtype. LongRoPE stacks two: rows [0, original) of
        # the short factors, then row original + p for position p with the long ones.
        self._table: Optional[torch.Tensor] = None
        self._table_covers = 0
        self._cache: Optional[torch.Tensor] = None
        # Tables replaced by larger ones stay alive: a CUDA graph captured by an engine sharing
        # this model reads the table it was captured with (freed, its memory would be reused).
        self._retired: list[torch.Tensor] = []
        self._cache_covers = 0

    def _dynamic_inv_freq(self, seq_len: int) -> torch.Tensor:
        # Dynamic NTK: the base grows once a sequence passes the trained length (as HF does,
        # from the longest position in the batch).
        factor = self.scaling["factor"]
        dim = self.rotary_dim
        base = self.base * ((factor * seq_len / self.max_position) - (factor - 1)) ** (
            dim / (dim - 2)
        )
        with torch.device("cpu"):
            return _base_inv_freq(dim, base)

    def _freq_table(self, inv_freq: torch.Tensor, size: int) -> torch.Tensor:
        freqs = torch.outer(torch.arange(size, dtype=torch.float32, device="cpu"), inv_freq)
        return torch.stack([freqs.cos(), freqs.sin()], dim=1) * self.attention_factor

    def _build_table(self, length: int) -> tuple[torch.Tensor, int]:
        """A float32 host table and the positions it covers (>= length)."""
        size = max(length, self.max_position, 1)
        table = self._freq_table(self.inv_freq, size)
        if self.long_inv_freq is not None:
            table = torch.cat(
                [table[: self.original_max], self._freq_table(self.long_inv_freq, size)]
            )
        return table, size

    def _cos_sin_table(self, length: int, device: torch.device) -> torch.Tensor:
        """The float32 table covering positions [0, >= length) on `device` (the eager path's)."""
        table = self._table
        if table is None or self._table_covers < length or table.device != device:
            table, self._table_covers = self._build_table(length)
            if self._table is not None:
                self._retired.append(self._table)
            self._table = table = table.to(device)
        return table

    def _rows(self, positions: torch.Tensor) -> torch.Tensor:
        """Table rows of the positions: themselves, or for LongRoPE the long-factor rows when any
        position of the batch is past the original length (HF's rule, from the batch's longest
        sequence), decided on the device (no synchronisation, CUDA-graph safe)."""
        if self.long_inv_freq is None:
            return positions
        past = (positions >= self.original_max).any().to(positions.dtype)
        return positions + past * self.original_max

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin, each [T, rotary_dim / 2]."""
        if self.rope_type == "dynamic":
            seq_len = int(positions.max()) + 1 if positions.numel() else 0
            if seq_len > self.max_position:
                inv = self._dynamic_inv_freq(seq_len).to(positions.device)
                freqs = positions.float()[:, None] * inv[None, :]
                return freqs.cos(), freqs.sin()
        need = self.max_position
        # Only on the CPU: a GPU check would synchronise every step (the engine keeps positions
        # below max_position_embeddings there).
        if positions.numel() and positions.device.type == "cpu":
            need = max(need, int(positions.max()) + 1)
        cs = self._cos_sin_table(need, positions.device)[self._rows(positions)]
        return cs[:, 0], cs[:, 1]

    def reserve(self, length: int, dtype: torch.dtype, device: torch.device) -> None:
        """Builds the tables for positions below ``length`` now: the engine's max_model_len may
        pass max_position (rope scaling stretches the context), and on a GPU positions are not
        checked per step (nor may a captured CUDA graph grow a table)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # as tensors report it: "cuda:0"
            device = torch.device("cuda", torch.cuda.current_device())
        self._cos_sin_table(length, device)
        if dtype in _FUSED_DTYPES:
            self._op_cache(length, dtype, device)

    def _op_cache(self, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The op's [length >= max_position, rotary_dim] cos | sin table in `dtype` (the op rounds
        cos and sin to the query's dtype anyway: a table in it holds the same values in half the
        bytes)."""
        cache = self._cache
        if (
            cache is None
            or self._cache_covers < length
            or cache.dtype != dtype
            or cache.device != device
        ):
            # Built on the host, so the device keeps only this table (a float32 one of
            # Llama 3's 131072 positions would hold another 64 MB).
            table, self._cache_covers = self._build_table(length)
            if self._cache is not None:
                self._retired.append(self._cache)
            self._cache = cache = table.flatten(1).to(dtype).contiguous().to(device)
        return cache

    def _table_for(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions, table) for the op: the shared table, or for dynamic NTK past the trained
        length a table of this call's own positions (its frequencies depend on the batch)."""
        need = 0
        # Position checks only on the CPU: on the GPU they would synchronise every step (the
        # engine keeps positions below max_position_embeddings there).
        if positions.numel() and (positions.device.type == "cpu" or self.rope_type == "dynamic"):
            need = int(positions.max()) + 1
        if self.rope_type == "dynamic" and need > self.max_position:
            cos, sin = self.cos_sin(positions)
            table = torch.cat([cos, sin], dim=1).to(dtype).contiguous()
            return torch.arange(len(positions), device=positions.device), table
        return self._rows(positions), self._op_cache(need, dtype, positions.device)

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: Optional[torch.Tensor]
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Rotates q [T, Hq, head_dim] and k [T, Hk, head_dim] (or None) in place (views of a
        fused qkv projection are fine) and returns them."""
        if q.dtype not in _FUSED_DTYPES or k is not None and k.dtype != q.dtype:
            cos, sin = self.cos_sin(positions)
            q.copy_(apply_rotary(q, cos, sin, self.rotary_dim, self.is_neox))
            if k is not None:
                k.copy_(apply_rotary(k, cos, sin, self.rotary_dim, self.is_neox))
            return q, k
        pos, table = self._table_for(positions, q.dtype)
        ops.rotary_embedding(pos, q, k, self.head_dim, table, self.is_neox)
        return q, k


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotary_dim: Optional[int] = None,
    is_neox: bool = True,
) -> torch.Tensor:
    """The eager rotary of HF's models on x [T, H, D] with float32 cos/sin [T, rotary_dim / 2]
    (a rotated copy; the dims past rotary_dim are kept)."""
    rot = x.shape[-1] if rotary_dim is None else rotary_dim
    half = rot // 2
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:rot]
    else:
        x1, x2 = x[..., 0:rot:2], x[..., 1:rot:2]
    o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.cat([o1, o2], dim=-1) if is_neox else torch.stack([o1, o2], -1).flatten(-2)
    return torch.cat([rotated, x[..., rot:]], dim=-1) if rot < x.shape[-1] else rotated
