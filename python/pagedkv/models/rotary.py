"""Rotary position embedding (neox / rotate-half layout, as in HF checkpoints) with the
llama3, linear, dynamic-NTK, YaRN and LongRoPE (Phi-3) frequency scalings, over all of a head's
dims or its first ones (partial rotary: GPT-NeoX, Phi-4-mini)."""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn


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


def _longrope_inv_freq(dim: int, base: float, s: dict[str, Any]
                       ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short inv_freq, long inv_freq, attention factor) of LongRoPE: per-frequency divisors,
    the long ones for positions past the original training length."""
    orig = s["original_max_position_embeddings"]
    factor = s.get("factor") or s["max_position_embeddings"] / orig
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        attn_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def inv(factors: list[float]) -> torch.Tensor:
        return 1.0 / (torch.tensor(factors, dtype=torch.float32) * base ** exponents)

    return inv(s["short_factor"]), inv(s["long_factor"]), float(attn_factor)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, s: dict[str, Any], max_pos: int
                   ) -> tuple[torch.Tensor, float]:
    factor = s["factor"]
    orig = s.get("original_max_position_embeddings") or max_pos
    attn_factor = s.get("attention_factor")
    if attn_factor is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attn_factor = (_yarn_mscale(factor, s["mscale"])
                           / _yarn_mscale(factor, s["mscale_all_dim"]))
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
        1.0 / pos_freqs) * extrapolation_weight
    return inv_freq, float(attn_factor)


class RotaryEmbedding(nn.Module):
    """Holds a cos/sin table grown on demand; ``forward`` rotates q and k in place of copies."""

    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: Optional[dict[str, Any]] = None) -> None:
        super().__init__()
        self.head_dim, self.max_position, self.base = head_dim, max_position, base
        self.scaling = dict(scaling) if scaling else None
        rope_type = self.scaling["rope_type"] if self.scaling else "default"
        self.rope_type = rope_type
        self.attention_factor = 1.0
        self.long_inv_freq: Optional[torch.Tensor] = None  # LongRoPE, from original_max on
        with torch.device("cpu"):  # also when the model is built under torch.device("meta")
            inv_freq = _base_inv_freq(head_dim, base)
            if rope_type == "linear":
                inv_freq = inv_freq / self.scaling["factor"]
            elif rope_type == "llama3":
                inv_freq = _llama3_inv_freq(inv_freq, self.scaling)
            elif rope_type == "freq_factors":  # GGUF rope_freqs tensor (llama.cpp's form)
                inv_freq = inv_freq / torch.tensor(self.scaling["factors"], dtype=torch.float32)
            elif rope_type == "yarn":
                inv_freq, self.attention_factor = _yarn_inv_freq(head_dim, base, self.scaling,
                                                                 max_position)
            elif rope_type == "longrope":
                # Chosen per position, not per batch: a sequence's rotation then never depends on
                # its batch-mates. (HF generate re-encodes the whole sequence with the long factors
                # once it passes the original length; a paged cache keeps the earlier keys.)
                inv_freq, self.long_inv_freq, self.attention_factor = _longrope_inv_freq(
                    head_dim, base, self.scaling)
        self.inv_freq = inv_freq  # [head_dim / 2] float32, CPU
        self._table: Optional[torch.Tensor] = None  # [len, 2, head_dim / 2] float32

    def _dynamic_inv_freq(self, seq_len: int) -> torch.Tensor:
        # Dynamic NTK: the base grows once a sequence passes the trained length (as HF does,
        # from the longest position in the batch).
        factor = self.scaling["factor"]
        base = self.base * ((factor * seq_len / self.max_position) - (factor - 1)) ** (
            self.head_dim / (self.head_dim - 2))
        with torch.device("cpu"):
            return _base_inv_freq(self.head_dim, base)

    def _cos_sin_table(self, length: int, device: torch.device) -> torch.Tensor:
        table = self._table
        if table is None or table.shape[0] < length or table.device != device:
            size = max(length, self.max_position, 1)
            freqs = torch.outer(torch.arange(size, dtype=torch.float32, device="cpu"),
                                self.inv_freq)
            if self.long_inv_freq is not None:
                orig = self.scaling["original_max_position_embeddings"]
                freqs[orig:] = torch.outer(torch.arange(orig, size, dtype=torch.float32),
                                           self.long_inv_freq)
            table = torch.stack([freqs.cos(), freqs.sin()], dim=1) * self.attention_factor
            self._table = table = table.to(device)
        return table

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin, each [T, head_dim / 2]."""
        if self.rope_type == "dynamic":
            seq_len = int(positions.max()) + 1 if positions.numel() else 0
            if seq_len > self.max_position:
                inv = self._dynamic_inv_freq(seq_len).to(positions.device)
                freqs = positions.float()[:, None] * inv[None, :]
                return freqs.cos(), freqs.sin()
        table = self._cos_sin_table(self.max_position, positions.device)
        # Only on the CPU: a GPU check would synchronise every step (the engine keeps positions
        # below max_position_embeddings there).
        if positions.numel() and positions.device.type == "cpu":
            need = int(positions.max()) + 1
            if need > table.shape[0]:
                table = self._cos_sin_table(need, positions.device)
        cs = table[positions]
        return cs[:, 0], cs[:, 1]

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] -> rotated copies (same dtype)."""
        cos, sin = self.cos_sin(positions)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary on x [T, H, D] with float32 cos/sin [T, R/2]: the first R dims turn
    (R = D but for partial rotary), the rest pass through."""
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        turned = apply_rotary(x[..., :rotary_dim], cos, sin)
        return torch.cat([turned, x[..., rotary_dim:]], dim=-1)
    half = x.shape[-1] // 2
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
