"""Incremental detokenization for streaming, and stop-string helpers.

Decoding token by token breaks multi-byte characters (one emoji can span several byte-level
tokens) and the leading-space rules of sentencepiece vocabularies. Like vLLM, each step decodes a
small window: ``ids[prefix_offset:]`` against ``ids[prefix_offset:read_offset]``; the new text
is the difference, emitted only once it does not end in an unfinished character ("\\ufffd").
The emitted deltas add up to ``tokenizer.decode(all ids)``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Optional

_UNFINISHED = "\ufffd"


class IncrementalDetokenizer:
    """Per-sequence streaming state. ``append(new_ids)`` -> the text that became stable;
    ``flush()`` at the end -> whatever was held back (an unfinished character decodes to
    "\\ufffd" there, as in a full decode)."""

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.token_ids: list[int] = []
        self.output_text = ""
        self.prefix_offset = 0  # window start: context that fixes spacing of the next token
        self.read_offset = 0  # tokens before this are already in output_text

    def _decode(self, ids: Sequence[int]) -> str:
        if self.spaces_between_special_tokens:  # the default: the tokenizer's own decode
            return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, spaces_between_special_tokens=False
        )

    def _delta(self, final: bool) -> str:
        ids = self.token_ids
        if self.read_offset == len(ids):
            return ""
        prefix = self._decode(ids[self.prefix_offset : self.read_offset])
        text = self._decode(ids[self.prefix_offset :])
        if not final and (text.endswith(_UNFINISHED) or len(text) <= len(prefix)):
            return ""
        if not text.startswith(prefix):
            # The new token changed how the window's start decodes (rare clean-up rules):
            # fall back to the full decode, which is always right.
            full = self._decode(ids)
            delta = full[len(self.output_text) :] if full.startswith(self.output_text) else ""
        else:
            delta = text[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        self.output_text += delta
        return delta

    def append(self, new_ids: Sequence[int]) -> str:
        self.token_ids.extend(int(t) for t in new_ids)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)


def join_added_tokens(
    decode: Callable[[list[int]], str], ids: Sequence[int], added_ids: Collection[int]
) -> str:
    """``decode(ids)`` without the separator a decoder puts between two consecutive added
    (special) tokens: vLLM's ``spaces_between_special_tokens=False`` for fast tokenizers, where
    such a token right after another is emitted as its bare content. WordPiece decodes
    [CLS] [SEP] as "[CLS] [SEP]"; this gives "[CLS][SEP]". The ids are decoded in runs cut
    between such pairs, so every other token keeps the decoder's spacing."""
    ids = list(ids)
    cuts = [i for i in range(1, len(ids)) if ids[i] in added_ids and ids[i - 1] in added_ids]
    if not cuts:
        return decode(ids)
    bounds = [0, *cuts, len(ids)]
    return "".join(decode(ids[a:b]) for a, b in zip(bounds, bounds[1:]))


def added_token_ids(hf_tokenizer: Any) -> frozenset[int]:
    """Ids of the tokenizer's added tokens (special or not), as vLLM's detokenizer takes them."""
    table = getattr(hf_tokenizer, "added_tokens_decoder", None)
    if table is None:
        rust = getattr(hf_tokenizer, "_tokenizer", hf_tokenizer)
        getter = getattr(rust, "get_added_tokens_decoder", None)
        table = getter() if getter is not None else {}
    return frozenset(int(t) for t in table)


def find_stop_string(
    text: str, new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool = False
) -> Optional[tuple[str, int]]:
    """Looks for a stop string that overlaps the last ``new_chars`` characters of ``text`` (the
    part that arrived this step; earlier text was checked before). Returns (the stop string
    found earliest, the length to truncate ``text`` to) or None."""
    best: Optional[tuple[str, int]] = None
    for s in stop:
        if not s:
            continue
        start = max(0, len(text) - new_chars - len(s) + 1)
        i = text.find(s, start)
        if i >= 0 and (best is None or i < best[1]):
            best = (s, i)
    if best is None:
        return None
    s, i = best
    return s, i + len(s) if include_stop_str_in_output else i


def truncate_at_stop(
    text: str, new_chars: int, stop: Sequence[str], include_stop_str_in_output: bool = False
) -> tuple[str, Optional[str]]:
    """(text cut at the earliest stop string, that stop string) or (text, None)."""
    hit = find_stop_string(text, new_chars, stop, include_stop_str_in_output)
    return (text, None) if hit is None else (text[: hit[1]], hit[0])


def stop_holdback(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string, and so must
    not be streamed yet (they may be cut once the next token arrives)."""
    longest = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest
