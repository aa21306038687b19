"""EngineConfig: every knob of LLM / LLMEngine (vLLM's names), resolved once at start-up."""

from __future__ import annotations

import dataclasses
import numbers
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch

from pagedkv import ops
from pagedkv.engine.spec_decode.config import SpeculativeConfig
from pagedkv.engine.vllm_args import VLLM_ONLY_ARGS, check_vllm_arg

# vLLM's --kv-cache-dtype choices, the kernels' one list (include/pagedkv/ops.h). "auto": the
# cache holds the model dtype; the fp8 kinds store one byte per element (uint8 arrays of the same
# shape), "fp8" meaning e4m3 as in vLLM.
KV_CACHE_DTYPES = ops.KV_CACHE_DTYPES

# Seeds are int64, as vLLM's OpenAI protocol bounds them (torch itself takes -2**63..2**64-1).
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1

TP_ALL_REDUCES = ("nccl", "one_shot")

# Field types, checked before the value rules (a CLI or config file may hand over strings).
_INT_FIELDS = (
    "block_size",
    "max_num_seqs",
    "max_seq_len_to_capture",
    "max_logprobs",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "pipeline_micro_batch_tokens",
    "max_loras",
    "max_lora_rank",
)
_OPTIONAL_INT_FIELDS = (
    "num_cpu_blocks",
    "num_gpu_blocks_override",
    "max_model_len",
    "max_num_batched_tokens",
    "seed",
    "max_cpu_loras",
)
_FLOAT_FIELDS = ("gpu_memory_utilization", "swap_space")
_OPTIONAL_FLOAT_FIELDS = ("kv_cache_space",)
_BOOL_FIELDS = (
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "enforce_eager",
    "skip_tokenizer_init",
    "trust_remote_code",
    "disable_log_stats",
    "enable_lora",
    "disable_cascade_attn",
    "cascade_cuda_graphs",
)
_OPTIONAL_BOOL_FIELDS = ("async_scheduling",)


@dataclass
class EngineConfig:
    model: Optional[str] = None  # None / "smollm2": the embedded default model
    tokenizer: Optional[str] = None  # defaults to the model's own tokenizer
    dtype: Union[str, torch.dtype] = "auto"
    # vLLM's quantization: None (the checkpoint's quantization_config, if any), "fp8", "awq",
    # "gptq" (models/quantization); "fp8" also quantises an unquantised checkpoint.
    quantization: Optional[str] = None
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
    seed: Optional[int] = 0  # None means 0, as in vLLM V1
    enforce_eager: bool = False
    max_seq_len_to_capture: int = 8192  # CUDA graphs cover decodes up to this length
    # Schedule and launch step N+1 while the device runs step N (vLLM's async scheduling,
    # SGLang's overlap scheduler): the serial loop's outputs, less device idle time. None:
    # auto, on wherever it is supported (see overlapped_steps); True where it is not: refused.
    async_scheduling: Optional[bool] = None
    # vLLM's switch for cascade attention: decode rows whose contexts start with the same cached
    # blocks (a shared system prompt, parallel samples) attend to those blocks once for all of
    # them (pagedkv.cascade), in eager steps and CUDA graphs, where the decode has the balanced
    # kernel it runs on (Hopper, the CPU).
    disable_cascade_attn: bool = False
    # The decode CUDA graphs' cascade variant (CudaGraphRunner): steps whose rows share a prefix
    # replay a graph captured on the cascade path; off, they replay the plain graph (the cascade
    # then runs on eager steps only). Off until benchmarks/gpu_cascade_run.sh has run it.
    cascade_cuda_graphs: bool = False
    served_model_name: Optional[str] = None
    skip_tokenizer_init: bool = False  # no tokenizer: prompts are token ids, outputs have no text
    # Most logprobs / prompt_logprobs a request may ask for (vLLM's default 20; -1: the vocab).
    max_logprobs: int = 20
    # vLLM arguments accepted so that vLLM code runs unchanged. pagedkv runs its own model code,
    # never a checkpoint's, so trust_remote_code changes nothing; there are no periodic stats
    # logs to disable.
    trust_remote_code: bool = False
    disable_log_stats: bool = False
    # Ranks = tensor x pipeline parallel size, one process each (engine/executor_mp.py).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    # Pipeline stages overlap within a step: a step with at least twice this many prefill
    # tokens is cut into micro-batches of at least this many (at most one per stage); 0: never
    # cut; decode-only steps are never cut (engine/micro_batches.py says why).
    pipeline_micro_batch_tokens: int = 256
    # The tensor-parallel all-reduce: "nccl" (the process group's: NCCL on GPUs, gloo on the
    # CPU) or "one_shot" (CUDA: torch symmetric memory, each GPU reads its peers' buffers over
    # NVLink, for messages up to 4 MiB; distributed/one_shot_all_reduce.py).
    tp_all_reduce: str = "nccl"
    # Where the model comes from and how its config is read (vLLM's names).
    revision: Optional[str] = None  # hub branch / tag / commit of the model
    tokenizer_revision: Optional[str] = None
    download_dir: Optional[str] = None  # HF cache folder instead of HF_HUB_CACHE
    hf_overrides: Optional[Dict[str, Any]] = None  # config.json keys replaced
    rope_scaling: Optional[Dict[str, Any]] = None  # config.json's rope_scaling replaced
    rope_theta: Optional[float] = None
    generation_config: str = "auto"  # "auto" | "vllm" | a folder with generation_config.json
    override_generation_config: Optional[Dict[str, Any]] = None  # its keys replaced
    # LoRA adapters (pagedkv.lora): max_loras device slots (the most adapters one step may use)
    # of rank up to max_lora_rank; max_cpu_loras adapters kept in host memory (default
    # max_loras); lora_kernel: how the deltas run, one of models/lora.py's LORA_KERNELS ("auto":
    # its auto_kernel rule).
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: Optional[int] = None
    lora_kernel: str = "auto"
    # vLLM's speculative_config dict: method "ngram" or a draft model (engine/spec_decode/).
    speculative_config: Optional[Dict[str, Any]] = None
    # Pooling models (engine/runner_choice.py, engine/pooler.py), vLLM's names: task "auto" |
    # "generate" | "embed" | "classify" | "score" | "reward"; runner "auto" | "generate" |
    # "pooling"; convert "auto" | "none" | "embed" | "classify" | "reward"; pooler_config (or its
    # older name override_pooler_config): PoolerConfig fields over the checkpoint's own.
    task: str = "auto"
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: Optional[Dict[str, Any]] = None
    override_pooler_config: Optional[Dict[str, Any]] = None
    # Multimodal models (engine/multimodal.py): vLLM's most items of each modality one prompt
    # may carry, e.g. {"image": 2} (a modality left out: DEFAULT_MM_LIMIT).
    limit_mm_per_prompt: Optional[Dict[str, int]] = None
    # vLLM's: the directory whose image files chat image_url parts may name as file:// URLs
    # (held resolved; None: file:// URLs are refused).
    allowed_local_media_path: Optional[str] = None

    @classmethod
    def from_kwargs(cls, model: Optional[str] = None, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        for name in sorted(set(kwargs) & set(VLLM_ONLY_ARGS) - names):
            check_vllm_arg(name, kwargs.pop(name))  # vLLM's: accepted if harmless, or refused
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unexpected engine argument(s): {', '.join(unknown)}")
        cfg = cls(model=model, **kwargs)
        cfg.validate()
        return cfg

    def _check_types(self) -> None:
        def want(name: str, kind: str) -> TypeError:
            v = getattr(self, name)
            return TypeError(f"{name} must be {kind}, got {type(v).__name__} {v!r}")

        for name in _INT_FIELDS + _OPTIONAL_INT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_INT_FIELDS:
                continue
            if not isinstance(v, numbers.Integral) or isinstance(v, bool):
                raise want(name, "an int" + (" or None" if name in _OPTIONAL_INT_FIELDS else ""))
            setattr(self, name, int(v))
        for name in _FLOAT_FIELDS + _OPTIONAL_FLOAT_FIELDS:
            v = getattr(self, name)
            if v is None and name in _OPTIONAL_FLOAT_FIELDS:
                continue
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
                raise want(name, "a number")
            setattr(self, name, float(v))
        for name in _BOOL_FIELDS + _OPTIONAL_BOOL_FIELDS:
            v = getattr(self, name)
            if not isinstance(v, bool) and not (v is None and name in _OPTIONAL_BOOL_FIELDS):
                kind = " or None (auto)" if name in _OPTIONAL_BOOL_FIELDS else ""
                raise want(name, "True or False" + kind)

    def validate(self) -> None:
        self._check_types()
        spec = SpeculativeConfig.from_dict(self.speculative_config)  # refuses the unsupported
        if spec is not None and spec.model is not None and self.world_size > 1:
            # The draft runs on the driver's rank only; its cache would miss the workers'.
            raise ValueError(
                "speculative_config['model'] (a draft model) with tensor or pipeline "
                "parallelism is not supported yet"
            )
        if self.seed is None:
            self.seed = 0
        if self.block_size not in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            raise ValueError(f"block_size must be a power of two <= 256, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be >= 0 GiB, got {self.swap_space}")
        if self.kv_cache_space is not None and self.kv_cache_space <= 0:
            raise ValueError(f"kv_cache_space must be > 0 GiB, got {self.kv_cache_space}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if self.cascade_cuda_graphs and (self.disable_cascade_attn or self.enforce_eager):
            raise ValueError(
                "cascade_cuda_graphs=True captures the cascade variant of the decode CUDA graphs: "
                "it needs the cascade (disable_cascade_attn=False) and CUDA graphs "
                "(enforce_eager=False)"
            )
        if self.preemption_mode not in ("recompute", "swap"):
            raise ValueError(
                f"preemption_mode must be 'recompute' or 'swap', got {self.preemption_mode!r}"
            )
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(
                f"scheduling_policy must be 'fcfs' or 'priority', got {self.scheduling_policy!r}"
            )
        if not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be in [-2**63, 2**63 - 1], got {self.seed}")
        self._validate_lora()
        if self.async_scheduling:
            blocker = self.serial_loop_reason()
            if blocker is not None:
                raise ValueError(f"async_scheduling with {blocker} is not supported yet")
        if self.max_logprobs < -1:
            raise ValueError(f"max_logprobs must be -1 (no cap) or >= 0, got {self.max_logprobs}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tp_all_reduce not in TP_ALL_REDUCES:
            raise ValueError(
                f"tp_all_reduce must be one of {', '.join(TP_ALL_REDUCES)}, got "
                f"{self.tp_all_reduce!r}"
            )
        if self.pipeline_micro_batch_tokens < 0:
            raise ValueError(
                "pipeline_micro_batch_tokens must be >= 0 (0: no micro-batches), got "
                f"{self.pipeline_micro_batch_tokens}"
            )
        self._check_model_source()
        from pagedkv.engine.runner_choice import check_runner_args

        check_runner_args(self)
        if self.limit_mm_per_prompt is not None:
            from pagedkv.engine.multimodal import check_mm_limits

            check_mm_limits(self.limit_mm_per_prompt)
        if self.allowed_local_media_path == "":  # vLLM's default: none
            self.allowed_local_media_path = None
        if self.allowed_local_media_path is not None:
            self.allowed_local_media_path = _existing_dir(
                "allowed_local_media_path", self.allowed_local_media_path
            )

    def _validate_lora(self) -> None:
        from pagedkv.models.lora import LORA_KERNELS

        if self.lora_kernel not in LORA_KERNELS:
            raise ValueError(
                f"lora_kernel must be one of {', '.join(LORA_KERNELS)}, got {self.lora_kernel!r}"
            )
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1, got {self.max_lora_rank}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if self.enable_lora and self.tensor_parallel_size * self.pipeline_parallel_size > 1:
            raise ValueError("enable_lora with tensor or pipeline parallelism is not supported yet")

    def _check_model_source(self) -> None:
        for name in ("revision", "tokenizer_revision", "download_dir", "generation_config"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise TypeError(f"{name} must be a str, got {type(v).__name__} {v!r}")
        for name in ("hf_overrides", "rope_scaling", "override_generation_config"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, dict):
                # vLLM also takes a function of its HF config object; pagedkv has none to pass.
                raise TypeError(
                    f"{name} must be a dict of config.json keys, got {type(v).__name__}"
                )
        if self.override_generation_config:
            self._check_generation_override(self.override_generation_config)
        if self.rope_theta is not None and (
            isinstance(self.rope_theta, bool)
            or not isinstance(self.rope_theta, numbers.Real)
            or not self.rope_theta > 0
        ):
            raise ValueError(f"rope_theta must be a number > 0, got {self.rope_theta!r}")

    @staticmethod
    def _check_generation_override(override: Dict[str, Any]) -> None:
        """The sampling defaults override_generation_config sets must be valid sampling
        parameters: checked here, not at the first request (after the model has loaded)."""
        from pagedkv.engine.sampling_params import SamplingParams
        from pagedkv.models.generation_config import sampling_defaults

        try:
            SamplingParams(**sampling_defaults(override))
        except (TypeError, ValueError) as e:
            raise ValueError(f"override_generation_config: {e}") from None

    def model_load_kwargs(self) -> Dict[str, Any]:
        """load_model's keyword arguments from this config (the engine and every worker load
        the same checkpoint the same way)."""
        overrides = self.config_overrides()
        return dict(
            quantization=self.quantization,
            revision=self.revision,
            download_dir=self.download_dir,
            hf_overrides=overrides or None,
        )

    def config_overrides(self) -> Dict[str, Any]:
        """hf_overrides with rope_scaling / rope_theta folded in (they win, as in vLLM)."""
        out = dict(self.hf_overrides or {})
        if self.rope_scaling is not None:
            out["rope_scaling"] = dict(self.rope_scaling)
        if self.rope_theta is not None:
            out["rope_theta"] = float(self.rope_theta)
        return out

    def serial_loop_reason(self) -> Optional[str]:
        """The feature of this config that needs the serial step loop, or None. (Pooling does
        too: runner_choice decides it after reading the checkpoint, and refuses an explicit
        async_scheduling=True there. TP / PP overlap: the driver's tokens reach the workers
        by a device broadcast, engine/executor_mp.py.)"""
        if self.speculative_config:
            # An overlapped step plans the next one before this one's tokens (hence its
            # drafts) are known.
            return "speculative_config"
        return None

    @property
    def overlapped_steps(self) -> bool:
        """Whether a generation engine of this config runs the overlapped loop: as asked, and
        by default (None) on one rank wherever it is supported, the outputs being the serial
        loop's."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        # TP / PP overlap is exact on gloo (CPU tests) but has not run on GPUs (NCCL, graphs):
        # opt-in there until a multi-GPU run measures it.
        return self.serial_loop_reason() is None and self.world_size == 1

    @property
    def world_size(self) -> int:
        """Ranks the model runs on (one process each)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

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


def _existing_dir(name: str, path: Any) -> str:
    """``path`` resolved (symlinks, '..'), which must be an existing directory."""
    if not isinstance(path, (str, os.PathLike)) or not os.path.isdir(path):
        raise ValueError(f"{name} must be an existing directory, got {path!r}")
    return os.path.realpath(path)
