"""The environment variables pagedkv reads, each with its vLLM twin: one table, one reader.

A deployment moving from vLLM keeps its environment: where pagedkv has a ``PAGEDKV_*``
variable and vLLM one for the same thing, the vLLM name is read too, the ``PAGEDKV_`` one
winning when both are set. Missing the twin would be a silent surprise (``VLLM_API_KEY``
ignored: a server running without a key).
"""

from __future__ import annotations

import os
from typing import Dict, Optional

# pagedkv's name -> vLLM's name for the same setting.
VLLM_TWINS: Dict[str, str] = {
    "PAGEDKV_API_KEY": "VLLM_API_KEY",  # the server's API key (--api-key)
    "PAGEDKV_LOGGING_LEVEL": "VLLM_LOGGING_LEVEL",  # the log level of LLM and the server
    "PAGEDKV_MAX_N_SEQUENCES": "VLLM_MAX_N_SEQUENCES",  # the most samples one prompt asks for
    "PAGEDKV_ALLOW_RUNTIME_LORA_UPDATING": "VLLM_ALLOW_RUNTIME_LORA_UPDATING",  # /v1/*_lora_adapter
    "PAGEDKV_CACHE_DIR": "VLLM_CACHE_ROOT",  # where pagedkv keeps files it derives (GGUF)
}


def source(name: str) -> Optional[str]:
    """The variable that sets ``name`` (``name`` itself, else its vLLM twin), or None when
    neither is set to a non-empty value."""
    if name not in VLLM_TWINS:
        raise KeyError(f"{name} is not in pagedkv.envs.VLLM_TWINS")
    for candidate in (name, VLLM_TWINS[name]):
        if os.environ.get(candidate):
            return candidate
    return None


def getenv(name: str, default: Optional[str] = None) -> Optional[str]:
    """``$name``, else its vLLM twin's value, else ``default`` (empty values count as unset)."""
    found = source(name)
    return os.environ[found] if found is not None else default
