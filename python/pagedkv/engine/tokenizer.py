"""Tokenizer: a thin wrapper over a Hugging Face fast tokenizer, from an HF directory or a GGUF
file (transformers rebuilds it from the GGUF metadata; that takes seconds, so the result is
cached on disk as tokenizer.json)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any, Optional, Union

from pagedkv import envs
from pagedkv.engine.detokenizer import added_token_ids, join_added_tokens

Message = dict[str, Any]
Conversation = list[Message]


def cache_dir() -> str:
    return envs.getenv("PAGEDKV_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "pagedkv"
    )


def _gguf_cache_path(gguf_path: str) -> str:
    st = os.stat(gguf_path)
    key = f"{os.path.abspath(gguf_path)}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    stem = os.path.basename(gguf_path)[: -len(".gguf")]
    return os.path.join(cache_dir(), "tokenizers", f"{stem}-{digest}")


def _load_gguf_tokenizer(gguf_path: str) -> Any:
    from transformers import AutoTokenizer

    cached = _gguf_cache_path(gguf_path)
    if os.path.isfile(os.path.join(cached, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(cached)
    tok = AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path) or ".", gguf_file=os.path.basename(gguf_path)
    )
    try:  # write to a temporary folder, then rename, so readers never see half a cache
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(cached))
        tok.save_pretrained(tmp)
        os.replace(tmp, cached)
    except OSError:
        shutil.rmtree(locals().get("tmp", ""), ignore_errors=True)
    return tok


class Tokenizer:
    """encode/decode/chat templates with the model's own vocabulary and template."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.hf = hf_tokenizer
        self._added: Optional[frozenset[int]] = None  # added token ids, read on first need

    @classmethod
    def from_pretrained(
        cls,
        model: Optional[str] = None,
        revision: Optional[str] = None,
        download_dir: Optional[str] = None,
    ) -> Tokenizer:
        """``model`` as for load_model: None/"smollm2", an HF directory, a .gguf file or a hub
        id (at ``revision``)."""
        from pagedkv.models.registry import resolve_model

        source = resolve_model(model, revision, download_dir, tokenizer_only=True)
        if source.kind == "gguf":
            return cls(_load_gguf_tokenizer(source.path))
        from transformers import AutoTokenizer

        try:
            return cls(AutoTokenizer.from_pretrained(source.path))
        except (OSError, ValueError) as e:
            raise ValueError(f"no usable tokenizer in {source.path!r}: {e}") from e

    # ------------------------------------------------------------------ ids and text
    @property
    def eos_token_id(self) -> Optional[int]:
        return self.hf.eos_token_id

    @property
    def bos_token_id(self) -> Optional[int]:
        return self.hf.bos_token_id

    @property
    def pad_token_id(self) -> Optional[int]:
        return self.hf.pad_token_id

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce, added tokens included."""
        return len(self.hf)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self.hf.all_special_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """``spaces_between_special_tokens=False`` (with special tokens kept) drops what the
        decoder puts between two consecutive added tokens, as vLLM does; True is the
        tokenizer's own decode (slow tokenizers join added tokens with spaces themselves)."""
        if skip_special_tokens or spaces_between_special_tokens:
            return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if not getattr(self.hf, "is_fast", True):  # slow tokenizers take the flag natively
            return self.hf.decode(
                list(ids), skip_special_tokens=False, spaces_between_special_tokens=False
            )
        if self._added is None:
            self._added = added_token_ids(self.hf)
        return join_added_tokens(
            lambda run: self.hf.decode(run, skip_special_tokens=False), ids, self._added
        )

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self.hf.convert_ids_to_tokens(list(ids)))

    # ------------------------------------------------------------------ chat
    @property
    def chat_template(self) -> Optional[str]:
        return getattr(self.hf, "chat_template", None)

    def apply_chat_template(
        self,
        messages: Union[Conversation, Sequence[Conversation]],
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        **template_kwargs: Any,
    ) -> Union[str, list[int], list[str], list[list[int]]]:
        """One conversation -> its prompt (text, or ids with ``tokenize=True``); a list of
        conversations -> a list of prompts. ``chat_template`` (Jinja) overrides the model's."""
        batched = bool(messages) and isinstance(messages[0], (list, tuple))
        convs = list(messages) if batched else [messages]
        if chat_template is None and not self.chat_template:
            raise ValueError("this tokenizer has no chat template; pass chat_template=...")
        texts = [
            self.hf.apply_chat_template(
                list(c),
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
            for c in convs
        ]
        # The template already wrote any BOS it wants: encode without adding specials again.
        out = [self.encode(t, add_special_tokens=False) for t in texts] if tokenize else texts
        return out if batched else out[0]

    def __len__(self) -> int:
        return self.vocab_size

    # ------------------------------------------------------------------ the rest of HF's API
    # LLM.get_tokenizer() hands this object to vLLM code, which uses the HF tokenizer's API
    # (tokenizer(text).input_ids, convert_tokens_to_ids, batch_decode, eos_token, get_vocab):
    # what this wrapper does not define comes from the HF tokenizer.
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.hf(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "hf":  # no recursion before __init__ set hf
            raise AttributeError(name)
        return getattr(self.hf, name)
