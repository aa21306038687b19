"""Model code (plain torch modules, inference only) and weight loaders.

``load_model(name_or_path, dtype, device)`` returns ``(model, config)``; the model's forward takes a
flat batch of tokens and an attention backend that owns the KV cache (see attention_backend.py).
"""

from __future__ import annotations

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.loader import load_model
from pagedkv.models.registry import ModelSource, resolve_model

__all__ = ["AttentionBackend", "ModelConfig", "ModelSource", "load_model", "resolve_model"]
