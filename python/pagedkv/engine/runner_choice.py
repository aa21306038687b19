"""Which engine runs a model: generation (LLMEngine) or pooling (PoolingEngine), from vLLM's
``task`` / ``runner`` / ``convert`` engine arguments and, when they say "auto", the checkpoint's
architecture (a ``*ForSequenceClassification`` one classifies, a bare ``*Model`` or an encoder
embeds, a causal LM generates)."""

from __future__ import annotations

import logging
from typing import Any, Optional

from pagedkv.engine.config import EngineConfig

logger = logging.getLogger("pagedkv")

POOLING_TASKS = ("embed", "classify", "score", "reward")
TASKS = ("auto", "generate", "embedding", *POOLING_TASKS)  # "embedding": vLLM's older name
RUNNERS = ("auto", "generate", "pooling")
CONVERTS = ("auto", "none", "embed", "classify", "reward")


def check_runner_args(cfg: EngineConfig) -> None:
    """Values and contradictions of task / runner / convert (EngineConfig.validate)."""
    for name, allowed in (("task", TASKS), ("runner", RUNNERS), ("convert", CONVERTS)):
        value = getattr(cfg, name)
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
    pooling = cfg.task in ("embedding", *POOLING_TASKS) or cfg.convert not in ("auto", "none")
    if cfg.runner == "generate" and pooling:
        raise ValueError(
            f"runner='generate' contradicts task={cfg.task!r} / convert={cfg.convert!r} "
            "(pooling tasks run with runner='pooling')"
        )
    if cfg.task == "generate" and (cfg.runner == "pooling" or pooling):
        raise ValueError("task='generate' contradicts runner='pooling' / convert")
    for name in ("pooler_config", "override_pooler_config"):
        value = getattr(cfg, name)
        if value is not None and not isinstance(value, dict):
            raise TypeError(
                f"{name} must be a dict of PoolerConfig fields, got {type(value).__name__}"
            )
    if cfg.pooler_config is not None and cfg.override_pooler_config is not None:
        raise ValueError("give pooler_config or override_pooler_config (its older name), not both")


def _peek_config(cfg: EngineConfig) -> Optional[Any]:
    """The checkpoint's ModelConfig without its weights (None for GGUF files: causal LMs)."""
    from pagedkv.models.loader import load_config
    from pagedkv.models.registry import resolve_model

    source = resolve_model(cfg.model, cfg.revision, cfg.download_dir)
    if source.kind != "hf":
        return None
    return load_config(source, cfg.config_overrides() or None)


def _is_causal(mc: Any) -> bool:
    from pagedkv.models.registry import model_class

    return bool(getattr(model_class(mc.architecture), "is_causal", True))


def _pools_by_itself(mc: Optional[Any]) -> bool:
    """A checkpoint that cannot generate: a classifier, a bare model, an encoder."""
    return mc is not None and (mc.is_classifier or mc.is_base_model or not _is_causal(mc))


def pooling_task(cfg: EngineConfig, mc: Optional[Any]) -> Optional[str]:
    """The engine task ("embed", "classify", "score", "reward"), or None to generate."""
    task = "embed" if cfg.task == "embedding" else cfg.task
    classifier = mc is not None and mc.is_classifier
    if task in POOLING_TASKS:
        chosen: Optional[str] = task
    elif task == "generate" or cfg.runner == "generate":
        return None
    elif cfg.convert in ("embed", "classify", "reward"):
        chosen = cfg.convert
    elif cfg.runner == "pooling" or _pools_by_itself(mc):
        chosen = "classify" if classifier else "embed"
    else:
        return None
    if chosen in ("classify", "score") and not classifier:
        arch = mc.architecture if mc is not None else "this model"
        raise ValueError(
            f"task={chosen!r} needs a *ForSequenceClassification checkpoint (a score / "
            f"classifier head); {arch} has none and pagedkv does not add one"
        )
    return chosen


def _generative(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` for a generation engine, which has no pooler for pooler_config to set."""
    for name in ("pooler_config", "override_pooler_config"):
        if getattr(cfg, name) is not None:
            raise ValueError(
                f"{name} applies to pooling models; this one generates text (task "
                "'generate'): pass task='embed' / 'classify' / ... (or runner='pooling') to pool"
            )
    return cfg


def make_engine(model: Optional[str] = None, tokenizer: Optional[str] = None, **kwargs: Any) -> Any:
    """LLMEngine, or PoolingEngine when the arguments or the checkpoint say pooling."""
    from pagedkv.engine.llm_engine import LLMEngine

    cfg = EngineConfig.from_kwargs(model, tokenizer=tokenizer, **kwargs)
    wants_pooling = cfg.task not in ("auto", "generate") or cfg.runner == "pooling"
    may_pool = cfg.task == "auto" and cfg.runner == "auto"
    if not (wants_pooling or may_pool):
        return LLMEngine(config=_generative(cfg))
    mc = _peek_config(cfg) if cfg.model is not None or wants_pooling else None
    task = pooling_task(cfg, mc)
    if task is None:
        return LLMEngine(config=_generative(cfg))
    from pagedkv.engine.pooling_engine import PoolingEngine

    if cfg.speculative_config:  # pooling generates nothing to speculate on
        raise ValueError(f"speculative_config does not apply to pooling (task {task!r})")
    if cfg.async_scheduling:  # PoolingEngine.step runs serially: the flag would be ignored
        raise ValueError(
            f"async_scheduling is not supported for pooling (task {task!r}): a pooling step "
            "samples no tokens for the next step to overlap with"
        )
    cfg.task, cfg.runner = task, "pooling"
    if cfg.override_pooler_config is not None:
        cfg.pooler_config, cfg.override_pooler_config = cfg.override_pooler_config, None
    if mc is not None and not _is_causal(mc):
        # Every token attends to the whole prompt: no chunk sees its future, no prefix is final.
        cfg.enable_chunked_prefill = cfg.enable_prefix_caching = False
    return PoolingEngine(cfg, task)
