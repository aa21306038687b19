"""The tokenizer work of the OpenAI handlers: encoding and decoding off the event loop, in
threads of their own, and the length bound that refuses a text too long for the context before
it is tokenized."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence, TypeVar

from pagedkv.entrypoints.openai.errors import bad_request

T = TypeVar("T")


class TokenizerWork:
    # Tokenizing runs here, off the event loop (as vLLM does): a long prompt takes seconds and
    # the loop must keep serving /health, streams and other requests meanwhile. The fast
    # tokenizer releases the GIL while it works. One thread for requests that generate, and
    # one for /tokenize and /detokenize.
    _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedkv-tokenize")
    _count_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagedkv-count")
    tokenizer: Any
    state: Any

    def init_tokenizer_work(self, tokenizer: Any, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        # No token of the vocabulary spans more characters than this, so a text longer than
        # max_model_len times it cannot fit the context: such a prompt gets its 400 before it
        # is tokenized (a 30 MB prompt would keep the tokenizer busy for ~20 s).
        self.token_chars = _max_token_chars(tokenizer)
        self.max_chars = max_model_len * self.token_chars

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except TypeError:  # a tokenizer without the keyword
            return list(self.tokenizer.encode(text))

    def check_length(self, text_len: int, param: str) -> None:
        """400 for a text too long (in characters) to fit max_model_len in any tokenization."""
        if text_len > self.max_chars:
            raise bad_request(
                f"{param} is {text_len} characters long, more than can fit this model's "
                f"maximum context length of {self.state.max_model_len} tokens (at most "
                f"{self.max_chars} characters). Please reduce the length of the {param}.",
                param=param,
            )

    async def encode_async(
        self,
        text: str,
        add_special_tokens: bool = True,
        param: Optional[str] = "prompt",
        keep_last: Optional[int] = None,
    ) -> List[int]:
        """``encode`` in the tokenizer thread. With ``param``, a text that cannot fit the
        context is first rejected by its length (400 naming ``param``); /tokenize passes None
        (it may count any text) and runs in a thread of its own. ``keep_last``: vLLM's
        truncate_prompt_tokens, the last tokens only (of a text cut first to the characters
        they can span, with a margin, so that a huge text is not tokenized whole)."""
        if keep_last is not None:
            text = text[-(keep_last + 16) * self.token_chars :]
        elif param is not None:
            self.check_length(len(text), param)
        executor = self._executor if param is not None else self._count_executor
        ids = await asyncio.get_running_loop().run_in_executor(
            executor, self.encode, text, add_special_tokens
        )
        return ids[-keep_last:] if keep_last is not None else ids

    async def in_tokenizer_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in the requests' tokenizer thread (chat templates render there)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def in_count_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in /tokenize's thread: the unbounded tokenizer work of /tokenize and
        /detokenize stays off the event loop and out of the requests' tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self._count_executor, fn, *args)

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids -> text with special tokens spelled out, as vLLM's /detokenize, echoed
        token-id prompts and logprob tokens show them (HF's decode default): the text then
        matches the ids, and echo's logprobs text_offset the echoed text."""
        try:
            return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))
        except TypeError:  # a tokenizer without the keyword
            return str(self.tokenizer.decode(list(ids)))

    def decode_token(self, token_id: int) -> str:
        return self.decode([token_id])


def _max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` can stand for: its longest vocabulary
    entry. Byte-level BPE writes one character per byte and a text character is at least one
    byte; SentencePiece writes one per character ("\u2581" for a space). 64 when the
    tokenizer does not show its vocabulary."""
    hf = getattr(tokenizer, "hf", tokenizer)
    try:
        vocab = hf.get_vocab()
    except Exception:  # noqa: BLE001 - any tokenizer without a readable vocabulary
        return 64
    return max((len(t) for t in vocab), default=64) or 64
