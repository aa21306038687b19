"""Engine logprobs -> OpenAI's two logprob formats.

The engine reports, per token, a dict ``{token_id: logprob}`` holding the sampled token and
the top-k alternatives (vLLM's layout; a value may be a float or an object with ``.logprob``
and ``.decoded_token``). Prompt logprobs start with ``None`` for the first prompt token.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from pagedkv.entrypoints.openai.protocol import (
    ChatTokenLogprob,
    CompletionLogProbs,
    PromptLogprob,
    TopLogprob,
)

Decode = Callable[[int], str]
# (token text, its logprob or None, top alternatives [(text, logprob)] or None)
Entry = Tuple[str, Optional[float], Optional[List[Tuple[str, float]]]]


def _value(v: Any) -> float:
    lp = float(getattr(v, "logprob", v))
    return max(lp, -9999.0)  # JSON has no -inf; OpenAI clamps the same way


def _text(token_id: int, v: Any, decode: Decode) -> str:
    text = getattr(v, "decoded_token", None)
    return text if isinstance(text, str) else decode(token_id)


def entries(
    token_ids: Sequence[int],
    logprobs: Sequence[Optional[Dict[int, Any]]],
    decode: Decode,
    top_n: Optional[int] = None,
    as_ids: bool = False,
) -> List[Entry]:
    """``as_ids``: vLLM's return_tokens_as_token_ids, every token shown as "token_id:<id>"
    (tokens that are not valid UTF-8 on their own stay identifiable)."""
    if as_ids:
        decode = _as_id
        logprobs = [None if t is None else {k: _plain(v) for k, v in t.items()} for t in logprobs]
    out: List[Entry] = []
    for tid, table in zip(token_ids, logprobs):
        if table is None:
            out.append((decode(tid), None, None))
            continue
        chosen = table.get(tid)
        ranked = sorted(table.items(), key=lambda kv: -_value(kv[1]))
        if top_n is not None:
            ranked = ranked[:top_n]
        top = [(_text(t, v, decode), _value(v)) for t, v in ranked]
        out.append(
            (
                _text(tid, chosen, decode) if chosen is not None else decode(tid),
                _value(chosen) if chosen is not None else None,
                top,
            )
        )
    return out


def _as_id(token_id: int) -> str:
    return f"token_id:{token_id}"


def _plain(v: Any) -> float:
    """A logprob without its decoded text, so that the token's id spelling is used."""
    return float(getattr(v, "logprob", v))


def completion_logprobs(items: List[Entry], text_offset: int) -> CompletionLogProbs:
    """OpenAI completions format; ``text_offset`` is where the first token starts."""
    result = CompletionLogProbs()
    offset = text_offset
    for text, lp, top in items:
        result.tokens.append(text)
        result.token_logprobs.append(lp)
        result.top_logprobs.append(dict(top) if top is not None else None)
        result.text_offset.append(offset)
        offset += len(text)
    return result


def chat_logprobs(items: List[Entry]) -> List[ChatTokenLogprob]:
    out = []
    for text, lp, top in items:
        out.append(
            ChatTokenLogprob(
                token=text,
                logprob=lp if lp is not None else -9999.0,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[
                    TopLogprob(token=t, logprob=v, bytes=list(t.encode("utf-8")))
                    for t, v in (top or [])
                ],
            )
        )
    return out


def prompt_logprobs(
    table: Optional[Sequence[Optional[Dict[int, Any]]]], decode: Decode
) -> Optional[List[Optional[Dict[int, PromptLogprob]]]]:
    """The engine's prompt logprobs in vLLM's response shape (``prompt_logprobs``): per prompt
    token None (the first) or {token id: {logprob, rank, decoded_token}}, -inf as -9999."""
    if table is None:
        return None
    return [
        None
        if pos is None
        else {
            tid: PromptLogprob(
                logprob=_value(v),
                rank=getattr(v, "rank", None),
                decoded_token=_text(tid, v, decode),
            )
            for tid, v in pos.items()
        }
        for pos in table
    ]
