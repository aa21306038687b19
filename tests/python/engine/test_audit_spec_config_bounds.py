"""speculative_config's num_speculative_tokens bounded by max_model_len, refused by name at
construction (1e9 or 2**64 drafts were accepted; on the GPU they sized the verify graphs'
buffers and failed at startup with an out-of-memory or an overflow)."""

from __future__ import annotations

import pytest
from pagedkv import LLM
from pagedkv.testing import save_random_model


@pytest.mark.parametrize("k", [64, 10**9, 2**64])
def test_more_drafts_than_max_model_len_are_refused(tmp_path, k: int) -> None:
    path = save_random_model(str(tmp_path), "tiny-llama", head_dim=32)
    spec = {"method": "ngram", "prompt_lookup_max": 3, "num_speculative_tokens": k}
    with pytest.raises(ValueError, match="num_speculative_tokens.* below max_model_len=64"):
        LLM(path, device="cpu", kv_cache_space=0.01, max_model_len=64, speculative_config=spec)
