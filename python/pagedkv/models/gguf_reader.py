"""GGUF files: metadata as a dict, and tensors dequantized to float32 under HF names."""

from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
import torch

from pagedkv.models.config import ModelConfig

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
# Tensors llama.cpp keeps for its own use; nothing in the HF model corresponds to them.
_SKIPPED = {"rope_freqs.weight"}


def open_gguf(path: str) -> Any:
    import gguf

    return gguf.GGUFReader(path)


def gguf_metadata(reader: Any) -> dict[str, Any]:
    """Scalar and string fields; the big tokenizer arrays are left out (the tokenizer reads
    them itself)."""
    meta: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.rsplit(".", 1)[-1] in (
                "tokens", "token_type", "merges", "scores"):
            continue
        try:
            meta[key] = f.contents()
        except Exception:  # exotic field types we never need
            continue
    return meta


def gguf_config(reader: Any) -> ModelConfig:
    return ModelConfig.from_gguf_metadata(gguf_metadata(reader), {t.name for t in reader.tensors})


def hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if not m or m.group(2) not in _BLOCK_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} is not understood by pagedkv's loader")
    return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"


def _unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's rows for GPT-J style rope; HF weights are
    rotate-half style. Undo it: rows (head, pair, 2) -> (head, 2, pair)."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def gguf_weights(reader: Any, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized float32 tensors named as in the HF checkpoint."""
    from gguf import quants

    # Only the "llama" GGUF architecture stores permuted q/k; qwen2 is written neox-style.
    permuted = reader.fields["general.architecture"].contents() in ("llama", "mistral")
    for t in reader.tensors:
        if t.name in _SKIPPED:
            continue
        name = hf_name(t.name)
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])  # GGUF lists dims fastest-first
        if permuted and ".q_proj." in name:
            w = _unpermute_rope(w, cfg.num_attention_heads)
        elif permuted and ".k_proj." in name:
            w = _unpermute_rope(w, cfg.num_key_value_heads)
        if not w.flags.writeable or not w.flags.c_contiguous:  # F32 tensors view the mmap
            w = np.array(w, copy=True, order="C")
        yield name, torch.from_numpy(w)
