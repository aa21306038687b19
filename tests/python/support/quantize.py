"""Quantisers for tests, written from the formats' documented layouts (independent of
pagedkv.models.quantization): each turns a float HF checkpoint into a quantized one and into
its *dequantised* float twin, which HF transformers then serves as the reference.

    fp8:  e4m3 weights, weight_scale per tensor ([]) or per channel ([N, 1])
    awq:  AutoAWQ gemm: qweight [K, N/8] / qzeros [K/G, N/8] int32 (nibble i = column
          (0, 2, 4, 6, 1, 3, 5, 7)[i] of 8), scales [K/G, N] fp16
    gptq: AutoGPTQ v1: qweight [K/8, N] (nibble i = row 8j + i), qzeros [K/G, N/8] storing
          zero - 1, scales [K/G, N] fp16, g_idx [K]
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

import torch
from safetensors.torch import load_file, save_file

# The decoder's projections (what vLLM / AutoAWQ / AutoGPTQ quantise; not embeddings, lm_head).
LINEAR = re.compile(r"\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.weight$")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _pack(values: torch.Tensor, dim: int, order: tuple[int, ...] = tuple(range(8))
          ) -> torch.Tensor:
    """Codes 0..15 -> int32 words of 8 along ``dim`` (nibble i <- position order[i])."""
    v = values.to(torch.int64).movedim(dim, -1)
    v = v.reshape(*v.shape[:-1], v.shape[-1] // 8, 8)
    word = torch.zeros(v.shape[:-1], dtype=torch.int64)
    for i in range(8):
        word |= v[..., order[i]] << (4 * i)
    word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(torch.int32).movedim(-1, dim).contiguous()


def _int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric per-group quantisation of w [N, K]: codes [N, K], zeros [N, K/G] (ints), and
    scales [N, K/G] rounded to fp16 (what the checkpoint stores)."""
    n, k = w.shape
    g = w.double().reshape(n, k // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-6).half().double()
    zero = (-lo / scale).round().clamp(0, 15)
    codes = ((g / scale[..., None]).round() + zero[..., None]).clamp(0, 15)
    return codes.reshape(n, k).long(), zero.long(), scale.half()


def _dequant_int4(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                  group: int) -> torch.Tensor:
    z = zeros.double().repeat_interleave(group, 1)
    s = scales.double().repeat_interleave(group, 1)
    return ((codes.double() - z) * s).float()


def quantize_checkpoint(src: str, dst: str, ref: str, method: str, **kw: Any) -> None:
    """src (float HF dir) -> dst (quantized with ``method``) and ref (dequantised float)."""
    tensors = load_file(os.path.join(src, "model.safetensors"))
    quant: dict[str, torch.Tensor] = {}
    deq: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        if not LINEAR.search(name):
            quant[name] = deq[name] = w
            continue
        prefix = name[: -len("weight")]
        if method == "fp8":
            w32 = w.float()
            if kw.get("per_channel"):
                scale = w32.abs().amax(1, keepdim=True) / 448.0
            else:
                scale = w32.abs().amax().reshape(()) / 448.0
            q = (w32 / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            quant[prefix + "weight"], quant[prefix + "weight_scale"] = q, scale.float()
            deq[name] = (q.float() * scale).to(w.dtype)
            continue
        group = kw.get("group_size", 32)
        codes, zeros, scales = _int4(w.float(), group)
        deq[name] = _dequant_int4(codes, zeros, scales, group).to(w.dtype)
        if method == "awq":
            quant[prefix + "qweight"] = _pack(codes.t(), 1, AWQ_ORDER)
            quant[prefix + "qzeros"] = _pack(zeros.t(), 1, AWQ_ORDER)
        else:  # gptq v1
            quant[prefix + "qweight"] = _pack(codes.t(), 0)
            quant[prefix + "qzeros"] = _pack((zeros.t() - 1) & 0xF, 1)
            k = w.shape[1]
            quant[prefix + "g_idx"] = kw.get("g_idx", torch.arange(k) // group).to(torch.int32)
        quant[prefix + "scales"] = scales.t().contiguous()
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    qconfig: dict[str, Any] = {"quant_method": method}
    if method == "fp8":
        qconfig["activation_scheme"] = "dynamic"
    elif method == "awq":
        qconfig.update(bits=4, group_size=kw.get("group_size", 32), zero_point=True,
                       version="gemm")
    else:
        qconfig.update(bits=4, group_size=kw.get("group_size", 32), desc_act=False, sym=False,
                       checkpoint_format="gptq")
    qconfig.update(kw.get("extra_config", {}))
    for out, ts, cfg in ((dst, quant, {**config, "quantization_config": qconfig}),
                         (ref, deq, config)):
        shutil.copytree(src, out, dirs_exist_ok=True)
        save_file(ts, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=1)
