"""Which engine runs a model: generation (LLMEngine) or pooling (PoolingEngine), from vLLM's
``task`` / ``runner`` / ``convert`` engine arguments and, when they say "auto", the checkpoint's
architecture (a ``*ForSequenceClassification`` one classifies, a bare ``*Model`` or an encoder
embeds, a causal LM generates)."""

from __future__ import annotations

import logging
from typing import Any, Optional, Tuple

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


def _pooling_kind(mc: Optional[Any]) -> Optional[str]:
    """Why a checkpoint cannot generate text (None: it can, or its config is unknown): it is
    an encoder, a sequence classifier, or a bare model without a language-model head. The one
    rule for "pooling-only" (auto picks a pooling engine; a generation engine refuses it)."""
    if mc is None:
        return None
    if mc.is_encoder:
        return "encoder"
    if mc.is_classifier:
        return "classifier"
    if mc.is_base_model:
        return "bare"
    return None if _is_causal(mc) else "encoder"


def _pools_by_itself(mc: Optional[Any]) -> bool:
    """A checkpoint that cannot generate: a classifier, a bare model, an encoder."""
    return _pooling_kind(mc) is not None


def _own_task(mc: Optional[Any]) -> str:
    """The pooling task a checkpoint serves by itself: a classifier classifies, any other
    embeds."""
    return "classify" if mc is not None and mc.is_classifier else "embed"


_CANNOT_GENERATE = {
    "encoder": "is an encoder model (embeddings / classification / scores): it cannot generate "
    "text; serve it with task='embed' / 'classify' / 'score' (or runner='pooling')",
    "classifier": "is a sequence-classification model: it scores text and cannot generate; "
    "serve it with task='classify' (or 'score', runner='pooling')",
    "bare": "is a bare model without a language-model head: it cannot generate; serve it "
    "with task='embed' (or runner='pooling')",
}


class PoolingOnlyModelError(ValueError):
    """A generation engine asked of a checkpoint that cannot generate text, refused from its
    config before any weight is read. ``task``: the pooling task it serves by itself."""

    def __init__(self, mc: Any, kind: str) -> None:
        super().__init__(f"{mc.architecture} {_CANNOT_GENERATE[kind]}")
        self.architecture, self.task = str(mc.architecture), _own_task(mc)


def check_generative(mc: Any) -> None:
    """Raises PoolingOnlyModelError where the checkpoint (its ModelConfig) cannot generate."""
    kind = _pooling_kind(mc)
    if kind is not None:
        raise PoolingOnlyModelError(mc, kind)


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
        chosen = _own_task(mc)
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


def engine_task(cfg: EngineConfig) -> Tuple[Optional[str], Optional[Any]]:
    """The pooling task the engine for ``cfg`` serves (None: it generates text), with the
    checkpoint's ModelConfig where it was read. Decided from the arguments and the
    checkpoint's config alone, before any weight is loaded; task / runner 'generate' on a
    checkpoint that cannot generate raises PoolingOnlyModelError."""
    wants_pooling = cfg.task not in ("auto", "generate") or cfg.runner == "pooling"
    may_pool = cfg.task == "auto" and cfg.runner == "auto"
    if cfg.model is None and not wants_pooling:  # the default model: a causal LM
        return None, None
    mc = _peek_config(cfg)
    if not (wants_pooling or may_pool):
        check_generative(mc)
        return None, mc
    return pooling_task(cfg, mc), mc


def make_engine(model: Optional[str] = None, tokenizer: Optional[str] = None, **kwargs: Any) -> Any:
    """LLMEngine, or PoolingEngine when the arguments or the checkpoint say pooling."""
    from pagedkv.engine.llm_engine import LLMEngine

    cfg = EngineConfig.from_kwargs(model, tokenizer=tokenizer, **kwargs)
    task, mc = engine_task(cfg)
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
