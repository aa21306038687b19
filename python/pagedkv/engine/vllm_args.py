"""vLLM's EngineArgs that pagedkv does not take as its own, each refused by name with the reason.

Every engine argument of vLLM is either honoured (an EngineConfig field with vLLM's name and
meaning) or listed here. An argument listed here set to a value that changes nothing in pagedkv
(vLLM's default, e.g. ``load_format="auto"``) is accepted, so that vLLM scripts run unchanged;
any other value is refused with a ValueError saying why, instead of being ignored. The CLI
(entrypoints/engine_args.py) builds hidden flags from the same table, so ``pagedkv serve
--load-format dummy`` is refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple


@dataclass(frozen=True)
class Refused:
    reason: str
    harmless: Tuple[Any, ...] = (None,)  # values that change nothing here (vLLM's defaults)

    def accepts(self, value: Any) -> bool:
        return any(value is h or (type(value) is type(h) and value == h) for h in self.harmless)


_ONE_DEVICE = "pagedkv runs one engine, parallel over tensor / pipeline ranks only"
_LORA_DTYPE = "LoRA adapters run in the model's dtype"
_NO_LORA_TP = "LoRA adapters are not sharded over tensor-parallel ranks yet"
_NO_MM = "image models run their processor with its defaults"
_NO_SPEC = "speculative decoding sizes its own lookahead (speculative_config)"
_NO_COMPILE = "pagedkv runs its own kernels and CUDA graphs, not torch.compile"
_LOADER = "pagedkv loads safetensors / GGUF checkpoints with its own loader"
_OFF = (None, False)

# vLLM EngineArgs name -> why pagedkv refuses it (and which values are harmless).
VLLM_ONLY_ARGS: Dict[str, Refused] = {
    # Loading (revision, tokenizer_revision, download_dir, hf_overrides, rope_scaling,
    # rope_theta, generation_config and override_generation_config are EngineConfig fields).
    "code_revision": Refused("pagedkv never runs a checkpoint's code"),
    "hf_token": Refused(
        "hub downloads read the token from HF_TOKEN (or huggingface-cli login)", _OFF
    ),
    "hf_config_path": Refused("the config is read from the model folder"),
    "load_format": Refused(_LOADER, (None, "auto", "safetensors", "gguf")),
    "config_format": Refused(
        "the config is read as Hugging Face's config.json (or GGUF metadata)", (None, "auto", "hf")
    ),
    "model_loader_extra_config": Refused(_LOADER, (None, {})),
    "ignore_patterns": Refused(_LOADER, (None, [], "original/**/*")),
    "tokenizer_mode": Refused("pagedkv uses the Hugging Face fast tokenizer", (None, "auto", "hf")),
    "model_impl": Refused("pagedkv runs its own model code", (None, "auto")),
    "max_parallel_loading_workers": Refused(_LOADER),
    "use_tqdm_on_load": Refused("loading progress follows the log level", (None, True)),
    "enable_prompt_embeds": Refused("prompts are text or token ids", _OFF),
    # Parallelism and placement.
    "data_parallel_size": Refused(_ONE_DEVICE, (None, 1)),
    "distributed_executor_backend": Refused(_ONE_DEVICE, (None, "mp", "uni")),
    "enable_expert_parallel": Refused(_ONE_DEVICE, _OFF),
    "disable_custom_all_reduce": Refused(_ONE_DEVICE, (None, False, True)),
    "worker_cls": Refused(_ONE_DEVICE, (None, "auto")),
    "worker_extension_cls": Refused(_ONE_DEVICE, (None, "")),
    "kv_transfer_config": Refused("KV transfer between instances is not supported"),
    "kv_events_config": Refused("KV-cache events are not published"),
    # Memory and cache.
    "cpu_offload_gb": Refused("weights stay on the device", (None, 0, 0.0)),
    "kv_cache_memory_bytes": Refused("use gpu_memory_utilization or kv_cache_space"),
    "calculate_kv_scales": Refused("fp8 KV caches use scales of 1.0", _OFF),
    "prefix_caching_hash_algo": Refused(
        "prefix-cache keys use pagedkv's own hash", (None, "builtin", "sha256")
    ),
    "disable_sliding_window": Refused(
        "sliding windows are applied as the model defines them", _OFF
    ),
    "kv_sharing_fast_prefill": Refused("no model here shares KV caches across layers", _OFF),
    "enable_sleep_mode": Refused(
        "sleep mode (offloading weights while idle) is not supported", _OFF
    ),
    # Scheduling.
    "num_lookahead_slots": Refused(_NO_SPEC, (None, 0)),
    "scheduler_delay_factor": Refused("the scheduler runs every step at once", (None, 0, 0.0)),
    "max_num_partial_prefills": Refused("one partial prefill per step", (None, 1)),
    "max_long_partial_prefills": Refused("one partial prefill per step", (None, 1)),
    "long_prefill_token_threshold": Refused("one partial prefill per step", (None, 0)),
    "scheduler_cls": Refused("the scheduler is pagedkv's C++ one"),
    "cuda_graph_sizes": Refused(
        "CUDA graphs cover decode batches up to max_seq_len_to_capture", (None, [])
    ),
    "compilation_config": Refused(_NO_COMPILE, (None, {}, 0)),
    "logits_processors": Refused("custom logits processors are not supported", (None, [])),
    "logprobs_mode": Refused(
        "logprobs are those of the raw model logits (vLLM's default)", (None, "raw_logprobs")
    ),
    # Structured outputs run on xgrammar with its defaults (engine/structured_output.py);
    # reasoning parsers are the server's (serve --reasoning-parser).
    "structured_outputs_config": Refused(
        "structured outputs use xgrammar with its defaults", (None, {})
    ),
    "guided_decoding_backend": Refused(
        "structured outputs use xgrammar", (None, "auto", "xgrammar")
    ),
    # LoRA and multimodal.
    # (enable_lora, max_loras, max_lora_rank, max_cpu_loras, limit_mm_per_prompt,
    # allowed_local_media_path are EngineConfig's own.)
    "lora_dtype": Refused(_LORA_DTYPE, (None, "auto")),
    "fully_sharded_loras": Refused(_NO_LORA_TP, _OFF),
    "mm_processor_kwargs": Refused(_NO_MM, (None, {})),
    # Observability.
    "mm_processor_cache_gb": Refused(
        "images are processed once per request, without a processor cache", (None, 4, 4.0, 0)
    ),
    "mm_shm_cache_max_object_size_mb": Refused(
        "there is no shared-memory cache of processed images", (None, 128)
    ),
    "skip_mm_profiling": Refused("there is no memory profiling of image inputs", _OFF),
    "interleave_mm_strings": Refused(
        "image parts are placed as vLLM places them by default (before the text)", _OFF
    ),
    "media_io_kwargs": Refused("images are read with their loaders' defaults", (None, {})),
    "mm_encoder_tp_mode": Refused(
        "image models do not run under tensor parallelism", (None, "weights")
    ),
    "enable_mm_embeds": Refused("image inputs are images, not precomputed embeddings", _OFF),
    "video_pruning_rate": Refused("video inputs are not supported"),
    "io_processor_plugin": Refused("pagedkv has no IO processor plugins"),
    "lora_extra_vocab_size": Refused(
        "LoRA adapters cannot add vocabulary (vLLM dropped it too)", (None, 256)
    ),
    # Older or newer vLLM versions' arguments a script may still pass.
    "num_scheduler_steps": Refused(
        "the scheduler plans one step at a time (vLLM V0's multi-step scheduling)", (None, 1)
    ),
    "disable_async_output_proc": Refused(
        "outputs are always processed off the step's critical path", (None, False, True)
    ),
    "logits_processor_pattern": Refused("requests cannot name logits processors"),
    "enable_eplb": Refused("experts are not spread over devices (no expert parallelism)", _OFF),
    "enable_return_routed_experts": Refused("MoE routing decisions are not returned", _OFF),
    "otlp_traces_endpoint": Refused("OpenTelemetry tracing is not supported"),
    "collect_detailed_traces": Refused("OpenTelemetry tracing is not supported"),
    "show_hidden_metrics_for_version": Refused("pagedkv has no hidden metrics"),
    "additional_config": Refused("pagedkv has no platform plugins", (None, {})),
}


# EngineConfig fields that LLM() honours but the command line refuses: the CLI commands and
# the server take and return text.
CLI_REFUSED_ARGS: Dict[str, Refused] = {
    "skip_tokenizer_init": Refused(
        "the CLI commands and the server take and return text (LLM() takes it)", _OFF
    ),
}


def check_vllm_arg(name: str, value: Any) -> None:
    """Nothing if ``value`` changes nothing; ValueError naming ``name`` and the reason else."""
    rule = VLLM_ONLY_ARGS.get(name) or CLI_REFUSED_ARGS[name]
    if not rule.accepts(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ValueError(
            f"{name}={shown} is not supported: {rule.reason} (vLLM engine "
            "argument; pagedkv accepts only its default)"
        )
