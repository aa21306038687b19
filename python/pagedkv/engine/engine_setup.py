"""Start-up of an engine: model, tokenizer, KV cache, scheduler, CUDA graphs, sampler.

Logs each stage on the "pagedkv" logger (with timings), the way vLLM's start-up reads, so a
user can follow a slow load and see how large the KV cache came out.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from pagedkv.engine.config import EngineConfig
from pagedkv.engine.model_runner import ModelRunner
from pagedkv.engine.runner_choice import check_generative
from pagedkv.engine.sampler import Sampler
from pagedkv.engine.spec_decode.config import DRAFT_MODEL, SpeculativeConfig
from pagedkv.models.generation_config import eos_token_ids as gen_eos_token_ids
from pagedkv.models.generation_config import load_generation_config, sampling_defaults
from pagedkv.models.registry import DEFAULT_MODEL, is_default_model

logger = logging.getLogger("pagedkv")


@dataclass
class EngineModelConfig:
    """What callers (server, CLI) need to know about the served model."""

    model: str  # the name the user asked for
    served_model_name: str
    max_model_len: int
    vocab_size: int
    dtype: torch.dtype
    device: torch.device
    hf_config: Any  # pagedkv.models.ModelConfig
    # SamplingParams fields set by the model's generation_config.json (--generation-config):
    # the defaults of requests that set none (vLLM's get_default_sampling_params).
    generation_defaults: Dict[str, Any] = field(default_factory=dict)


@dataclass
class EngineParts:
    tokenizer: Any
    model_config: EngineModelConfig
    runner: Any  # ModelRunner, or a MultiprocExecutor with its interface over all ranks
    scheduler: Any
    sampler: Sampler
    num_blocks: int
    num_cpu_blocks: int
    eos_token_ids: List[int]


def build_engine_parts(cfg: EngineConfig, pooling: bool = False) -> EngineParts:
    """``pooling``: the parts of a PoolingEngine (cfg.runner == "pooling"); a generation engine
    refuses a config that asks for pooling rather than ignoring it."""
    asks_pooling = (
        cfg.runner == "pooling"
        or cfg.task not in ("auto", "generate")
        or cfg.convert not in ("auto", "none")
    )
    if pooling != asks_pooling:
        raise ValueError(
            f"task={cfg.task!r}, runner={cfg.runner!r} run on the pooling engine: build it "
            "with pagedkv.LLM(...) or pagedkv.engine.runner_choice.make_engine(...)"
        )
    device = cfg.resolve_device()
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    logger.info(
        "loading model %r on %s (dtype %s)", cfg.model or "smollm2 (default)", device, cfg.dtype
    )
    executor = None
    if cfg.world_size > 1:  # one process per rank; this one is rank 0 and holds its shard
        from pagedkv.engine.executor_mp import MultiprocExecutor

        executor = MultiprocExecutor(cfg, device)
        model, mc = executor.model, executor.model_config
    else:
        model, mc = _load_shared(cfg, device)
    try:
        return _build_rest(cfg, device, model, mc, executor, t0)
    except BaseException:
        if executor is not None:
            executor.shutdown()
        raise


def _build_rest(
    cfg: EngineConfig, device: torch.device, model: Any, mc: Any, executor: Any, t0: float
) -> EngineParts:
    import pagedkv
    from pagedkv.engine.tokenizer import Tokenizer

    dtype = next(model.parameters()).dtype
    logger.info(
        "model loaded in %.1f s: %s, %d layers, hidden %d, %d/%d heads, vocab %d, %s",
        time.perf_counter() - t0,
        mc.architecture,
        mc.num_hidden_layers,
        mc.hidden_size,
        mc.num_attention_heads,
        mc.num_key_value_heads,
        mc.vocab_size,
        dtype,
    )
    # vLLM: the model's own tokenizer follows the model's revision unless told otherwise.
    tok_revision = cfg.tokenizer_revision or (None if cfg.tokenizer else cfg.revision)
    tokenizer = (
        None
        if cfg.skip_tokenizer_init
        else Tokenizer.from_pretrained(cfg.tokenizer or cfg.model, tok_revision, cfg.download_dir)
    )
    generation = load_generation_config(
        cfg.generation_config, model.source.directory if model.source.kind == "hf" else None
    )
    max_model_len = _max_model_len(cfg, mc)
    _check_draft_length(cfg, max_model_len)
    batched = cfg.max_num_batched_tokens or _default_batched_tokens(cfg, device, max_model_len)
    if executor is not None:
        executor.make_runner(max_model_len, batched)
        runner = executor
    else:
        runner = ModelRunner(cfg, model, mc, device, dtype, max_model_len, batched)
        spec = SpeculativeConfig.from_dict(cfg.speculative_config)
        if spec is not None and spec.method == DRAFT_MODEL:  # before the KV cache is sized
            _check_draft_target(model, cfg.model)
            runner.draft = _draft_runner(cfg, spec, device, mc, max_model_len, batched)
    num_blocks, num_cpu = runner.determine_num_blocks()
    capacity = num_blocks * cfg.block_size
    if capacity < max_model_len:
        logger.warning(
            "the KV cache holds %d tokens, fewer than max_model_len=%d: lowering "
            "max_model_len to %d",
            capacity,
            max_model_len,
            capacity,
        )
        max_model_len = runner.max_model_len = capacity
        if getattr(runner, "draft", None) is not None:
            runner.draft.max_model_len = capacity
    if not cfg.enable_chunked_prefill and batched < max_model_len:
        batched = runner.max_num_batched_tokens = max_model_len
    runner.allocate_kv_cache(num_blocks, num_cpu)
    sched_cfg = pagedkv.SchedulerConfig(
        num_blocks=num_blocks,
        block_size=cfg.block_size,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=batched,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        enable_prefix_caching=cfg.enable_prefix_caching,
        num_cpu_blocks=num_cpu,
        preemption_mode=cfg.preemption_mode,
        policy=cfg.scheduling_policy,
        max_model_len=_scheduler_len(cfg, max_model_len, num_blocks),
    )
    scheduler = pagedkv.Scheduler(sched_cfg)
    if cfg.runner != "pooling":  # pooling steps are prefills: no decode graph would replay
        runner.capture_cuda_graphs(cfg.max_num_seqs)
    eos = _eos_ids(tokenizer, mc, gen_eos_token_ids(generation))
    name = cfg.model or "smollm2"
    model_config = EngineModelConfig(
        name,
        cfg.served_model_name or name,
        max_model_len,
        mc.vocab_size,
        dtype,
        device,
        mc,
        {
            **sampling_defaults(generation),
            **sampling_defaults(cfg.override_generation_config or {}),
        },
    )
    logger.info(
        "engine ready in %.1f s: max_model_len %d, max_num_seqs %d, "
        "max_num_batched_tokens %d, prefix caching %s, chunked prefill %s",
        time.perf_counter() - t0,
        max_model_len,
        cfg.max_num_seqs,
        batched,
        cfg.enable_prefix_caching,
        cfg.enable_chunked_prefill,
    )
    return EngineParts(
        tokenizer,
        model_config,
        runner,
        scheduler,
        Sampler(device, cfg.seed or 0),
        num_blocks,
        num_cpu,
        eos,
    )


# Loaded models by (model, dtype, device), held weakly: a second engine on the same weights
# (tests, a CLI bench next to an LLM) reuses them while the first is alive; none is kept alive
# by this table, so `del llm` still frees the memory.
_LOADED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _check_draft_target(model: torch.nn.Module, name: Optional[str]) -> None:
    """A draft model reads token ids only: an image model's prompts would reach it without
    their images (and, for Qwen2-VL, without M-RoPE positions), so it would draft blind."""
    if hasattr(model, "encode_images"):
        raise ValueError(
            f"speculative_config with a draft model: {name} takes images, which a draft "
            "model cannot read yet; use method 'ngram' for image models"
        )


def _draft_runner(
    cfg: EngineConfig,
    spec: SpeculativeConfig,
    device: torch.device,
    target_mc: Any,
    max_model_len: int,
    batched: int,
) -> ModelRunner:
    """The draft model (speculative_config['model']) loaded like the target (dtype, device),
    without the target's config overrides or adapters, and its runner; a draft whose
    vocabulary differs from the target's is refused before its weights are read."""
    t0 = time.perf_counter()
    draft_cfg = dataclasses.replace(
        cfg,
        model=spec.model,
        revision=spec.revision,
        quantization=spec.quantization,
        hf_overrides=None,
        rope_scaling=None,
        rope_theta=None,
        enable_lora=False,
        speculative_config=None,
    )

    def same_vocab(mc: Any) -> None:
        if mc.vocab_size != target_mc.vocab_size:
            raise ValueError(
                f"speculative_config['model']={spec.model!r} has vocab_size {mc.vocab_size}, "
                f"the target model {target_mc.vocab_size}: a draft model must share the "
                "target's vocabulary"
            )

    model, mc = _load_shared(draft_cfg, device, same_vocab)
    logger.info(
        "draft model %r loaded in %.1f s: %s, %d layers, hidden %d",
        spec.model,
        time.perf_counter() - t0,
        mc.architecture,
        mc.num_hidden_layers,
        mc.hidden_size,
    )
    dtype = next(model.parameters()).dtype
    return ModelRunner(draft_cfg, model, mc, device, dtype, max_model_len, batched)


def _load_shared(
    cfg: EngineConfig, device: torch.device, check: Optional[Callable[[Any], None]] = None
) -> Tuple[Any, Any]:
    """``check``: a further check of the model's config, before its weights are read."""
    from pagedkv.models import load_model

    overrides = cfg.config_overrides()
    key = (
        # (One key for the default's names: a draft "smollm2" shares the default target's.)
        DEFAULT_MODEL if is_default_model(cfg.model) else cfg.model,
        cfg.runner == "pooling",  # a pooling engine's model passed checks a generation one's
        str(cfg.dtype),
        str(device),
        cfg.quantization,
        cfg.revision,
        cfg.download_dir,
        json.dumps(overrides, sort_keys=True),
    )
    # enable_lora adds LoRA layers into the model itself: a shared model would be wrapped a
    # second time (the next engine's adapters refused) and change under the other engines.
    model: Any = None if cfg.enable_lora else _LOADED.get(key)  # (adds pagedkv_config below)
    if model is not None:
        if check is not None:
            check(model.pagedkv_config)
        return model, model.pagedkv_config
    pooling = cfg.runner == "pooling"
    model, mc = load_model(
        cfg.model,
        cfg.dtype,
        device,
        **cfg.model_load_kwargs(),
        check=lambda c: _check_all(c, pooling, check),
    )
    model.pagedkv_config = mc
    if not cfg.enable_lora:
        _LOADED[key] = model
    return model, mc


def _check_all(mc: Any, pooling: bool, check: Optional[Callable[[Any], None]]) -> None:
    check_servable(mc, pooling)
    if check is not None:
        check(mc)


def _check_draft_length(cfg: EngineConfig, max_model_len: int) -> None:
    """More drafts than a sequence can hold only size the CUDA verify graphs' buffers
    (max_num_seqs x (k + 1) tokens): k = 1e9 failed at startup with an out-of-memory, 2**64 with
    an overflow, neither naming the field."""
    spec = SpeculativeConfig.from_dict(cfg.speculative_config)
    if spec is not None and spec.num_speculative_tokens >= max_model_len:
        raise ValueError(
            f"speculative_config['num_speculative_tokens']={spec.num_speculative_tokens} must be "
            f"below max_model_len={max_model_len}"
        )


def check_servable(mc: Any, pooling: bool = False) -> None:
    """Refuses, before any weight is read, a model the engine cannot serve: a head size the
    attention kernels lack (it would fail at the first step), or, to generate, a model without
    an lm_head (a classifier, a bare model: ``pooling`` engines serve those)."""
    from pagedkv import ops

    sizes = list(ops.SUPPORTED_HEAD_SIZES)  # the kernels' one list (include/pagedkv/ops.h)
    if mc.head_dim not in sizes:
        raise ValueError(
            f"{mc.architecture} has head size {mc.head_dim}, which the paged "
            f"attention kernels do not support; supported head sizes: {sizes}"
        )
    if not pooling:
        check_generative(mc)  # (runner_choice: the one "pooling-only" rule)


def _scheduler_len(cfg: EngineConfig, max_model_len: int, num_blocks: int) -> int:
    """The scheduler's length limit. A pooling request runs as a prompt plus one placeholder
    token that is never computed (it only ends the request): one more position lets a pooling
    prompt fill max_model_len, as in vLLM, where the cache has room for it."""
    if cfg.runner == "pooling" and num_blocks * cfg.block_size > max_model_len:
        return max_model_len + 1
    return max_model_len


def _max_model_len(cfg: EngineConfig, mc: Any) -> int:
    limit = int(mc.derived_max_model_len())  # max_position_embeddings, stretched by rope
    batch_rule = _batch_wide_rope_length(mc)
    if cfg.max_model_len is None:
        if batch_rule is not None and batch_rule < limit:
            # Below it, every sequence of a batch rotates alike; past it one long sequence would
            # switch its batch-mates' factors too (HF's and vLLM's rule): outputs would depend
            # on who shares the batch. Ask for max_model_len explicitly to go further.
            logger.warning(
                "max_model_len defaults to %d, the original context of this %s rope "
                "(past it the rope factors switch for a whole batch, so a request's "
                "output would depend on its batch-mates); pass max_model_len up to "
                "%d to allow longer contexts",
                batch_rule,
                mc.rope_scaling["rope_type"],
                limit,
            )
            return batch_rule
        return limit
    if cfg.max_model_len > limit:
        raise ValueError(
            f"max_model_len={cfg.max_model_len} is larger than the model's "
            f"context length {limit} (max_position_embeddings="
            f"{mc.max_position_embeddings}, with its rope scaling)"
        )
    if cfg.max_model_len < 2:
        raise ValueError(f"max_model_len must be >= 2, got {cfg.max_model_len}")
    if batch_rule is not None and cfg.max_model_len > batch_rule:
        logger.warning(
            "max_model_len=%d is past the original context %d of this %s rope: once "
            "a sequence passes it the whole batch switches rope factors (as in HF "
            "and vLLM), so outputs can depend on batch-mates",
            cfg.max_model_len,
            batch_rule,
            mc.rope_scaling["rope_type"],
        )
    return int(cfg.max_model_len)


def _batch_wide_rope_length(mc: Any) -> Optional[int]:
    """The length past which a rope's factors are chosen for the whole batch (LongRoPE's long
    factors, dynamic NTK's grown base), or None for ropes that are position-wise."""
    s = mc.rope_scaling
    if not s:
        return None
    if s["rope_type"] == "longrope":
        return int(s.get("original_max_position_embeddings") or mc.max_position_embeddings)
    if s["rope_type"] == "dynamic":
        return int(mc.max_position_embeddings)
    return None


def _default_batched_tokens(cfg: EngineConfig, device: torch.device, max_model_len: int) -> int:
    if not cfg.enable_chunked_prefill:
        return max(max_model_len, 2048)
    # Offline throughput likes big steps on a GPU; on a CPU a 2048-token step is already long.
    return 8192 if device.type == "cuda" else 2048


def _eos_ids(tokenizer: Any, mc: Any, generation_eos: List[int]) -> List[int]:
    """The tokenizer's EOS, then config.json's and generation_config.json's (Llama 3 Instruct
    ends turns with <|eot_id|>, listed only in the generation config)."""
    ids: List[int] = []
    tok_eos: Optional[int] = tokenizer.eos_token_id if tokenizer is not None else None
    if tok_eos is not None:
        ids.append(int(tok_eos))
    for t in list(mc.eos_token_ids) + generation_eos:
        if int(t) not in ids:
            ids.append(int(t))
    return ids
