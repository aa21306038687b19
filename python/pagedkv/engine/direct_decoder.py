"""DirectDecoder: token ids -> text through the Rust `tokenizers` object, skipping the
transformers wrapper.

The engine decodes a small window per generated token per sequence (incremental
detokenization); through ``PreTrainedTokenizerFast.decode`` each call costs ~100 µs of Python
argument handling, which at a few hundred sequences per step exceeds a GPU decode step. The
direct call gives the same text (the wrapper adds only the WordPiece-era space clean-up, which we
apply too when the tokenizer asks for it and is not BPE, as transformers does).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from pagedkv.engine.detokenizer import added_token_ids, join_added_tokens


class DirectDecoder:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        hf = getattr(tokenizer, "hf", tokenizer)
        rust = getattr(hf, "_tokenizer", None)
        cleanup = bool(getattr(hf, "clean_up_tokenization_spaces", False))
        if cleanup and rust is not None:
            cleanup = type(rust.model).__name__ != "BPE"
        # Only take the fast path when it is exactly equivalent.
        self._rust = rust if rust is not None and not cleanup else None
        self._added: Optional[frozenset[int]] = None  # added token ids, read on first need

    def decode(
        self,
        ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        if not (skip_special_tokens or spaces_between_special_tokens):
            if self._rust is None:  # the wrapper applies the rule itself (slow ones natively)
                return self.tokenizer.decode(
                    list(ids), skip_special_tokens=False, spaces_between_special_tokens=False
                )
            if self._added is None:
                self._added = added_token_ids(getattr(self.tokenizer, "hf", self.tokenizer))
            rust = self._rust
            return join_added_tokens(
                lambda run: rust.decode(run, skip_special_tokens=False), ids, self._added
            )
        if self._rust is not None:
            return self._rust.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
