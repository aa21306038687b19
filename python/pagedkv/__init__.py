"""pagedkv: a paged KV-cache serving core for LLM inference.

The C++ core (block allocator, prefix cache, scheduler, paged-attention kernels) lives in the
extension ``pagedkv._C``; this package adds thin framework bridges (``pagedkv.ops``,
``pagedkv.PagedAttention``), the engine (``LLM``, ``SamplingParams``) and an OpenAI-compatible
server. Only numpy is needed to import it; the engine needs torch, and is imported lazily.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from pagedkv import _C
from pagedkv._C import __version__, build_info, cuda_available, cuda_device_count

if TYPE_CHECKING:  # what type checkers see of the lazy exports below (never run)
    from pagedkv import ops
    from pagedkv._C import BlockAllocator, Scheduler, SchedulerConfig, StepPlan
    from pagedkv.attention import PagedAttention
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine
    from pagedkv.engine.beam_search import BeamSearchOutput, BeamSearchParams
    from pagedkv.engine.llm import LLM
    from pagedkv.engine.llm_engine import LLMEngine
    from pagedkv.engine.outputs import CompletionOutput, RequestOutput
    from pagedkv.engine.pooling_outputs import (
        ClassificationOutput,
        ClassificationRequestOutput,
        EmbeddingOutput,
        EmbeddingRequestOutput,
        PoolingOutput,
        PoolingRequestOutput,
        ScoringOutput,
        ScoringRequestOutput,
    )
    from pagedkv.engine.pooling_params import PoolingParams
    from pagedkv.engine.sampling_params import RequestOutputKind, SamplingParams
    from pagedkv.engine.structured_output import GuidedDecodingParams, StructuredOutputsParams
    from pagedkv.lora.request import LoRARequest

__all__ = [
    "__version__",
    "build_info",
    "cuda_available",
    "cuda_device_count",
    "cmake_dir",
    "ops",
    "PagedAttention",
    "BlockAllocator",
    "Scheduler",
    "SchedulerConfig",
    "StepPlan",
    "LLM",
    "SamplingParams",
    "BeamSearchParams",
    "BeamSearchOutput",
    "RequestOutputKind",
    "StructuredOutputsParams",
    "GuidedDecodingParams",
    "RequestOutput",
    "CompletionOutput",
    "LLMEngine",
    "AsyncLLMEngine",
    "LoRARequest",
    "PoolingParams",
    "PoolingOutput",
    "PoolingRequestOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "ScoringOutput",
    "ScoringRequestOutput",
]

# Public names and the module that defines each; imported on first use so that `import pagedkv`
# stays cheap and works without torch.
_LAZY = {
    "ops": "pagedkv.ops",
    "PagedAttention": "pagedkv.attention",
    "BlockAllocator": "pagedkv._C",
    "Scheduler": "pagedkv._C",
    "SchedulerConfig": "pagedkv._C",
    "StepPlan": "pagedkv._C",
    "LLM": "pagedkv.engine.llm",
    "SamplingParams": "pagedkv.engine.sampling_params",
    "BeamSearchParams": "pagedkv.engine.beam_search",
    "BeamSearchOutput": "pagedkv.engine.beam_search",
    "RequestOutputKind": "pagedkv.engine.sampling_params",
    "StructuredOutputsParams": "pagedkv.engine.structured_output",
    "GuidedDecodingParams": "pagedkv.engine.structured_output",
    "RequestOutput": "pagedkv.engine.outputs",
    "CompletionOutput": "pagedkv.engine.outputs",
    "LLMEngine": "pagedkv.engine.llm_engine",
    "AsyncLLMEngine": "pagedkv.engine.async_llm_engine",
    "LoRARequest": "pagedkv.lora.request",
    "PoolingParams": "pagedkv.engine.pooling_params",
    "PoolingOutput": "pagedkv.engine.pooling_outputs",
    "PoolingRequestOutput": "pagedkv.engine.pooling_outputs",
    "EmbeddingOutput": "pagedkv.engine.pooling_outputs",
    "EmbeddingRequestOutput": "pagedkv.engine.pooling_outputs",
    "ClassificationOutput": "pagedkv.engine.pooling_outputs",
    "ClassificationRequestOutput": "pagedkv.engine.pooling_outputs",
    "ScoringOutput": "pagedkv.engine.pooling_outputs",
    "ScoringRequestOutput": "pagedkv.engine.pooling_outputs",
}


def _set_cpu_threads() -> None:
    """PAGEDKV_NUM_THREADS: the CPU kernels' thread count (default: the usable CPUs), read here
    once, before any kernel runs; the C++ library reads no environment variables."""
    value = os.environ.get("PAGEDKV_NUM_THREADS", "").strip()
    if not value:
        return
    if not value.isdigit() or int(value) == 0:
        raise ValueError(f"PAGEDKV_NUM_THREADS must be a positive integer, got {value!r}")
    _C.ops_set_num_threads(int(value))


_set_cpu_threads()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if name == "ops" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pagedkv' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy exports too (dir() and tab completion), before their first use.
    return sorted(set(globals()) | set(__all__))


def cmake_dir() -> str:
    """Folder holding pagedkvConfig.cmake, for ``-Dpagedkv_DIR=...`` in C++ projects."""
    from pathlib import Path

    return str(Path(__file__).parent / "cpp" / "lib" / "cmake" / "pagedkv")
