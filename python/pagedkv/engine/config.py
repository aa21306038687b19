"""EngineConfig: every knob of LLM / LLMEngine (vLLM's names), resolved once at start-up."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch

# vLLM's --kv-cache-dtype choices. "auto": the cache holds the model dtype; the fp8 kinds store
# one byte per element (uint8 arrays of the same shape), "fp8" meaning e4m3 as in vLLM.
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass
class EngineConfig:
    model: Optional[str] = None  # None / "smollm2": the embedded default model
    tokenizer: Optional[str] = None  # defaults to the model's own tokenizer
    dtype: Union[str, torch.dtype] = "auto"
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_space: Optional[float] = None  # GiB of KV cache on CPU (default 4)
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES (vLLM's CacheConfig.cache_dtype)
    swap_space: float = 4.0  # GiB of host memory for swapped-out blocks (preemption_mode="swap")
    num_cpu_blocks: Optional[int] = None  # overrides swap_space
    num_gpu_blocks_override: Optional[int] = None  # fixes the device KV-cache size (tests)
    max_model_len: Optional[int] = None
    max_num_seqs: int = 256
    max_num_batched_tokens: Optional[int] = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    preemption_mode: str = "recompute"  # "recompute" | "swap"
    scheduling_policy: str = "fcfs"  # "fcfs" | "priority"
    seed: int = 0
    enforce_eager: bool = False
    max_seq_len_to_capture: int = 8192  # CUDA graphs cover decodes up to this length
    served_model_name: Optional[str] = None
    skip_tokenizer_init: bool = False  # no tokenizer: prompts are token ids, outputs have no text

    @classmethod
    def from_kwargs(cls, model: Optional[str] = None, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unexpected engine argument(s): {', '.join(unknown)}")
        cfg = cls(model=model, **kwargs)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"block_size must be a power of two <= 256, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization}")
        if self.kv_cache_space is not None and self.kv_cache_space <= 0:
            raise ValueError(f"kv_cache_space must be > 0 GiB, got {self.kv_cache_space}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1, got "
                             f"{self.max_num_batched_tokens}")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError("preemption_mode must be 'recompute' or 'swap', got "
                             f"{self.preemption_mode!r}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError("scheduling_policy must be 'fcfs' or 'priority', got "
                             f"{self.scheduling_policy!r}")

    def kv_cache_torch_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The element type of the KV-cache arrays: fp8 caches are bytes (the ops' contract)."""
        return model_dtype if self.kv_cache_dtype == "auto" else torch.uint8

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            import pagedkv

            use_cuda = torch.cuda.is_available() and pagedkv.cuda_available()
            return torch.device("cuda" if use_cuda else "cpu")
        dev = torch.device(self.device)
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        return dev

    def summary(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
