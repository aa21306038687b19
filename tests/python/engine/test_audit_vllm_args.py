"""Audit 2026-11-27: vLLM EngineArgs that a vLLM script may pass (pooler_config,
override_pooler_config, kv_sharing_fast_prefill, allowed_local_media_path) were "unexpected
engine argument(s)" without a reason, though vllm_args.py promises every vLLM engine argument
is honoured or refused with one; harmless values (vLLM's defaults) must pass."""

from __future__ import annotations

import pytest
from pagedkv.engine.config import EngineConfig


@pytest.mark.parametrize(
    "name, value",
    [
        ("kv_sharing_fast_prefill", True),
    ],
)
def test_vllm_arg_refused_with_its_reason(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{name}=.* is not supported: \w+"):
        EngineConfig.from_kwargs(**{name: value})


@pytest.mark.parametrize(
    "name, value",
    [
        ("pooler_config", None),
        ("kv_sharing_fast_prefill", False),
        ("allowed_local_media_path", ""),
    ],
)
def test_vllm_default_is_accepted(name: str, value: object) -> None:
    EngineConfig.from_kwargs(**{name: value})


def test_allowed_local_media_path_is_honoured_since() -> None:
    """audit6: file:// image URLs under it are read (tests/python/server/
    test_audit6_local_media.py); a path that is no directory is refused naming the argument."""
    with pytest.raises(ValueError, match="allowed_local_media_path must be an existing"):
        EngineConfig.from_kwargs(allowed_local_media_path="/no/such/dir")
