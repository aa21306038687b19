"""GGUF files: metadata as a dict, and tensors dequantized to float32 under HF names."""

from __future__ import annotations

import mmap
import re
import struct
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
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
# GGUF value type -> struct format (8 = string, 9 = array).
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
# Tensors llama.cpp keeps for its own use; nothing in the HF model corresponds to them.
_SKIPPED = {"rope_freqs.weight"}


class GGUFFile:
    """A GGUF file's metadata and tensor directory, read with one pass over the header.

    The gguf package's own reader builds a numpy view per string of the vocabulary (100k+), which
    costs seconds; here the big tokenizer arrays are skipped (the tokenizer is built by
    transformers) and only the tensor data goes through ``gguf.quants.dequantize``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:  # the mapping stays valid after the file is closed
            self._buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        if self._buf[:4] != b"GGUF":
            raise ValueError(f"{path!r} is not a GGUF file (bad magic)")
        self._pos = 4
        version = self._scalar("<I")
        if version < 2:
            raise ValueError(f"{path!r}: GGUF version {version} is not supported")
        n_tensors, n_kv = self._scalar("<Q"), self._scalar("<Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._scalar("<Q") for _ in range(self._scalar("<I"))]
            qtype, offset = self._scalar("<I"), self._scalar("<Q")
            infos.append((name, dims, qtype, offset))
        align = int(self.metadata.get("general.alignment", 32))
        data_start = (self._pos + align - 1) // align * align
        self.tensors = [(name, dims, qtype, data_start + off) for name, dims, qtype, off in infos]

    def _scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (v,) = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return v

    def _string(self) -> str:
        n = self._scalar("<Q")
        s = self._buf[self._pos : self._pos + n].decode("utf-8", errors="replace")
        self._pos += n
        return s

    def _value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FORMATS:
            return self._scalar(_SCALAR_FORMATS[vtype])
        if vtype == _STRING:
            return self._string()
        if vtype != _ARRAY:
            raise ValueError(f"{self.path!r}: unknown GGUF value type {vtype}")
        item_type, count = self._scalar("<I"), self._scalar("<Q")
        if item_type in _SCALAR_FORMATS:
            fmt = _SCALAR_FORMATS[item_type]
            size = struct.calcsize(fmt)
            arr = np.frombuffer(self._buf, dtype=np.dtype(fmt), count=count, offset=self._pos)
            self._pos += size * count
            return arr
        items = [self._value(item_type) for _ in range(count)]
        return items

    def config(self) -> ModelConfig:
        cfg = ModelConfig.from_gguf_metadata(self.metadata, {t[0] for t in self.tensors})
        freqs = next((t for t in self.tensors if t[0] == "rope_freqs.weight"), None)
        if freqs is not None:
            # Llama 3.x GGUFs store the llama3 rope scaling as per-frequency divisors.
            from gguf import quants

            raw, kind = self.tensor_data(*freqs[1:])
            factors = np.asarray(quants.dequantize(raw, kind), dtype=np.float32).reshape(-1)
            cfg.rope_scaling = {"rope_type": "freq_factors", "factors": factors.tolist()}
        return cfg

    def tensor_data(self, dims: list[int], qtype: int, offset: int) -> tuple[np.ndarray, Any]:
        """(raw bytes of one tensor as rows, its GGMLQuantizationType) for gguf.dequantize."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        kind = GGMLQuantizationType(qtype)
        block, type_size = GGML_QUANT_SIZES[kind]
        rows = [int(d) for d in reversed(dims)]  # GGUF lists dims fastest-first
        nbytes = int(np.prod(rows)) // block * type_size
        raw = np.frombuffer(self._buf, dtype=np.uint8, count=nbytes, offset=offset)
        return raw.reshape(*rows[:-1], rows[-1] // block * type_size), kind


def open_gguf(path: str) -> GGUFFile:
    return GGUFFile(path)


def gguf_config(reader: GGUFFile) -> ModelConfig:
    return reader.config()


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


def gguf_weights(reader: GGUFFile, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """Dequantized float32 tensors named as in the HF checkpoint."""
    from gguf import quants

    # Only the "llama" GGUF architecture stores permuted q/k; qwen2 is written neox-style.
    permuted = reader.metadata["general.architecture"] in ("llama", "mistral")
    for gguf_name, dims, qtype, offset in reader.tensors:
        if gguf_name in _SKIPPED:
            continue
        name = hf_name(gguf_name)
        raw, kind = reader.tensor_data(dims, qtype, offset)
        w = np.asarray(quants.dequantize(raw, kind), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(dims)])
        if permuted and ".q_proj." in name:
            w = _unpermute_rope(w, cfg.num_attention_heads)
        elif permuted and ".k_proj." in name:
            w = _unpermute_rope(w, cfg.num_key_value_heads)
        if not w.flags.writeable or not w.flags.c_contiguous:  # F32 tensors view the mmap
            w = np.array(w, copy=True, order="C")
        yield name, torch.from_numpy(w)
