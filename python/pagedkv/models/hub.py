"""Hugging Face hub ids -> a checkpoint folder on disk, as vLLM and transformers resolve them:
the local HF cache first (HF_HOME / HF_HUB_CACHE, or ``download_dir``), then a download through
huggingface_hub of the files serving needs, unless HF_HUB_OFFLINE=1 says not to."""

from __future__ import annotations

import os
import re
from typing import Optional

# What serving reads: config and generation config, safetensors weights (and their index),
# tokenizer files and chat templates. Not: *.bin / *.pt / *.h5 copies of the same weights,
# ONNX / GGUF exports, images.
ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.tiktoken",
    "merges.txt",
    "vocab.txt",
    "*.jinja",
]
# A tokenizer from another repository (tokenizer=...): its files only, never its weights.
TOKENIZER_PATTERNS = [p for p in ALLOW_PATTERNS if p != "*.safetensors"]
_REPO_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


def looks_like_repo_id(name: str) -> bool:
    """``org/name`` or ``name`` (no path separators beyond one slash, no leading ./ or ~)."""
    return bool(_REPO_ID.match(name)) and not name.startswith(".") and ".." not in name


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def snapshot(
    repo_id: str,
    revision: Optional[str] = None,
    download_dir: Optional[str] = None,
    tokenizer_only: bool = False,
) -> str:
    """The local folder of ``repo_id`` at ``revision`` (a branch, tag or commit; default main):
    from the cache when it is there, else downloaded (only ALLOW_PATTERNS files, or
    TOKENIZER_PATTERNS for a tokenizer)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    where = f"{repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    cache = download_dir or _default_cache()
    patterns = TOKENIZER_PATTERNS if tokenizer_only else ALLOW_PATTERNS
    # What a usable snapshot holds (a cached revision may lack files a download would fetch).
    markers = ("tokenizer_config.json", "tokenizer.json") if tokenizer_only else ("config.json",)
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=download_dir,
            local_files_only=True,
            allow_patterns=patterns,
        )
        if any(os.path.isfile(os.path.join(path, m)) for m in markers):
            return path
    except LocalEntryNotFoundError:
        pass  # not cached: download below
    if offline():
        raise FileNotFoundError(
            f"model {where} is not in the Hugging Face cache ({cache}) and HF_HUB_OFFLINE=1 "
            "forbids downloading it: download it first (huggingface-cli download "
            f"{repo_id}), point HF_HOME / HF_HUB_CACHE / download_dir at a cache that has it, "
            "or pass a local checkpoint directory"
        )
    try:
        return snapshot_download(
            repo_id, revision=revision, cache_dir=download_dir, allow_patterns=patterns
        )
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise FileNotFoundError(
            f"model {where} is neither in the Hugging Face cache ({cache}) nor downloadable "
            f"({type(e).__name__}: {e}); pass a local checkpoint directory, or set HF_TOKEN for "
            "a gated repository"
        ) from e


def _default_cache() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)
