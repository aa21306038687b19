"""Pooling arguments refused by name instead of ignored: Matryoshka ``dimensions`` larger than the
model's embedding size (the full-width vector was returned), async_scheduling on a pooling
engine (it ran serially)."""

from __future__ import annotations

import pytest
from pagedkv import LLM
from pagedkv.engine.pooling_params import PoolingParams
from pagedkv.testing import save_random_model


def test_dimensions_wider_than_the_embedding_are_refused(tmp_path) -> None:
    path = save_random_model(str(tmp_path), "tiny-llama", head_dim=32, is_matryoshka=True)
    llm = LLM(path, device="cpu", task="embed", kv_cache_space=0.01, max_model_len=64)
    width = llm.llm_engine.runner.model.config.hidden_size
    out = llm.embed("x", pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    assert len(out[0].outputs.embedding) == 8
    with pytest.raises(ValueError, match=f"dimensions={width + 1} exceeds .* {width}"):
        llm.embed("x", pooling_params=PoolingParams(dimensions=width + 1), use_tqdm=False)


def test_async_scheduling_is_refused_for_pooling(tmp_path) -> None:
    # PoolingEngine.step runs serially: async_scheduling=True was accepted and ignored.
    path = save_random_model(str(tmp_path), "tiny-llama", head_dim=32)
    with pytest.raises(ValueError, match="async_scheduling is not supported for pooling"):
        LLM(path, device="cpu", task="embed", kv_cache_space=0.01, async_scheduling=True)
