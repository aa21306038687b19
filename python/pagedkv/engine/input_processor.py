"""InputProcessor: the one validator and converter of requests (vLLM v1's input processor).

``LLM``, ``LLMEngine``, ``AsyncLLMEngine`` and the OpenAI server all hand a prompt and its
SamplingParams to :meth:`InputProcessor.process`, which checks everything that depends on the
model (vocabulary, context length, logprobs cap), on the engine (priority policy) or on the
server's limits (list sizes), tokenizes every user string (the prompt and the bad words), and
returns an :class:`EngineRequest` that the engine can run without further checks. A bad value
raises ``ValueError`` (a wrong type ``TypeError``) whose message starts with the field's name,
so that the server's 400 can name the field (errors.field_named_in).

Running this off the engine thread is what keeps one request from stalling the others:
AsyncLLMEngine and the server call it in a worker thread; only the resulting EngineRequest
reaches the engine loop. Value rules that need no model (types, ranges, float32) live in
SamplingParams itself.
"""

from __future__ import annotations

import numbers
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from pagedkv import envs
from pagedkv.engine.llm_inputs import prompt_item
from pagedkv.engine.request_state import tokenize_bad_words
from pagedkv.engine.sampling_params import SamplingParams

# vLLM's $VLLM_MAX_N_SEQUENCES default: the most samples (n, best_of) one prompt may ask for.
DEFAULT_MAX_N_SEQUENCES = 16384
MAX_N_ENV = "PAGEDKV_MAX_N_SEQUENCES"
# A request id is logged and may be echoed in a response header: printable ASCII only, so that
# no id can forge a log line (CR / LF) or break a header. The engine's ids may be longer than a
# client's (the server adds a prefix and a suffix to the one a client gives).
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]+")
MAX_CLIENT_REQUEST_ID_CHARS = 256
_MAX_ENGINE_REQUEST_ID_CHARS = 512
_INT32 = (-(2**31), 2**31 - 1)


def max_n_sequences_from_env(value: Any = None, source: str = "max_n_sequences") -> int:
    """The `n` limit: ``value`` when given, else $PAGEDKV_MAX_N_SEQUENCES (or vLLM's
    $VLLM_MAX_N_SEQUENCES), else 16384. Not an integer >= 1: a configuration ValueError."""
    found = envs.source(MAX_N_ENV)
    if value is None and found is not None:
        value, source = os.environ[found], f"${found}"
    if value is None:
        return DEFAULT_MAX_N_SEQUENCES
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ValueError(f"{source} must be an integer >= 1, got {value!r}")
    return limit


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for (the server's --max-* flags; vLLM's names where vLLM has
    them). None: no limit (LLM / LLMEngine default, as in vLLM)."""

    # n and best_of: $PAGEDKV_MAX_N_SEQUENCES (or $VLLM_MAX_N_SEQUENCES), else 16384.
    max_n_sequences: int = field(default_factory=lambda: max_n_sequences_from_env())
    max_stop_strings: Optional[int] = None  # entries of `stop`
    max_bad_words: Optional[int] = None  # entries of `bad_words`
    max_word_chars: Optional[int] = None  # characters of one stop string or bad word
    max_logit_bias: Optional[int] = None  # entries of `logit_bias`
    # Pixels of one image (width x height), checked from the image's header before it decodes.
    max_image_pixels: Optional[int] = None
    # Where the engine-wide limit lives, for error messages ("set --max-stop-strings").
    source: str = "the engine"


@dataclass
class EngineRequest:
    """A checked request: what LLMEngine.add_request turns into scheduler state as is."""

    request_id: str
    prompt: Optional[str]  # the text, when given as text (echo, outputs)
    prompt_token_ids: List[int]  # after truncate_prompt_tokens
    params: SamplingParams
    max_tokens: int  # clamped to what the context leaves
    priority: int = 0
    arrival_time: float = field(default_factory=time.time)
    bad_words_token_ids: List[List[int]] = field(default_factory=list)
    # The compiled xgrammar grammar of params.structured_outputs (structured_output.py).
    grammar: Any = None
    mm: Any = None  # multimodal.MultiModalInputs of a prompt with images


def check_request_id(
    request_id: Any, name: str = "request_id", max_chars: int = _MAX_ENGINE_REQUEST_ID_CHARS
) -> str:
    """``request_id`` if it is 1 to ``max_chars`` printable ASCII characters, else ValueError
    naming ``name`` (the message shows a control character it refuses escaped)."""
    if not isinstance(request_id, str):
        raise TypeError(f"{name} must be a string, got {type(request_id).__name__}")
    if len(request_id) > max_chars or not _PRINTABLE_ASCII.fullmatch(request_id):
        raise ValueError(
            f"{name} must be 1 to {max_chars} printable ASCII characters (no control "
            f"characters such as CR / LF), got {ascii(request_id[:64])}"
        )
    return request_id


class InputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        max_model_len: int,
        max_logprobs: int = 20,
        scheduling_policy: str = "fcfs",
        limits: Optional[RequestLimits] = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self.max_model_len = int(max_model_len)
        # vLLM's max_logprobs, never more than the vocabulary (-1: the vocabulary).
        self.max_logprobs = (
            self.vocab_size if max_logprobs == -1 else min(max_logprobs, self.vocab_size)
        )
        self.scheduling_policy = scheduling_policy
        self.limits = limits or RequestLimits()
        # structured_output.GrammarCache, set by the engine: grammars compile here, off the
        # engine thread when the caller runs process() in a worker (AsyncLLMEngine, server).
        self.grammars: Any = None
        # The model's architecture (which modalities a prompt may carry) and, for a model that
        # reads images, its multimodal.ImageInputProcessor; set by the engine.
        self.architecture: Optional[str] = None
        self.images: Any = None

    # ------------------------------------------------------------------ the one entry point
    def process(
        self,
        request_id: str,
        prompt: Union[str, List[int], Dict[str, Any], None],
        params: Optional[SamplingParams] = None,
        arrival_time: Optional[float] = None,
        *,
        prompt_token_ids: Optional[Sequence[int]] = None,
        priority: Any = 0,
        limits: Optional[RequestLimits] = None,
    ) -> EngineRequest:
        """vLLM's add_request arguments -> an EngineRequest. ``prompt`` is text, a list of
        token ids, or a dict with "prompt" and / or "prompt_token_ids"; ``prompt_token_ids=``
        (the older keyword) wins over what ``prompt`` holds. ``limits`` overrides the
        processor's own (the server passes its flags)."""
        limits = limits or self.limits
        check_request_id(request_id)
        if params is None:
            params = SamplingParams()
        elif not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        priority = self.check_priority(priority)
        params = self.check_params(params, limits)
        text, ids, mm = self._prompt(prompt, prompt_token_ids, params, limits)
        max_tokens = self._max_tokens(ids, params)
        if params.min_tokens > max_tokens:
            # Only with max_tokens=None: the context ends the request first either way, and
            # the scheduler holds min_tokens as an int32.
            params = params.clone()
            params.min_tokens = max_tokens
        return EngineRequest(
            request_id,
            text,
            ids,
            params,
            max_tokens,
            priority,
            arrival_time or time.time(),
            self._bad_words(params),
            self._grammar(params),
            mm,
        )

    def _grammar(self, params: SamplingParams) -> Any:
        if params.structured_outputs is None:
            return None
        if self.grammars is None:
            raise ValueError("structured_outputs needs a tokenizer (skip_tokenizer_init=True)")
        return self.grammars.get(params.structured_outputs)

    # ------------------------------------------------------------------ parameters
    def check_params(self, params: SamplingParams, limits: RequestLimits) -> SamplingParams:
        """What SamplingParams cannot know alone: the vocabulary, the engine's caps, the
        tokenizer, the limits. Returns the params the engine runs (a copy when changed)."""
        self._check_sizes(params, limits)
        self.check_logprobs(params)
        self._check_token_ids(params)
        if self.tokenizer is None:
            if params.stop:
                raise ValueError("stop strings need a tokenizer (skip_tokenizer_init=True)")
            if params.bad_words:
                raise ValueError("bad_words need a tokenizer (skip_tokenizer_init=True)")
            if params.detokenize:
                params = params.clone()
                params.detokenize = False
        return params

    def _check_sizes(self, params: SamplingParams, limits: RequestLimits) -> None:
        """The list fields and strings within ``limits`` (one request cannot make every step
        slow: stop strings are searched and bad words matched at every step)."""
        where = limits.source
        if params.best_of > limits.max_n_sequences:  # type: ignore[operator]
            name = "n" if params.best_of == params.n else "best_of"
            raise ValueError(
                f"{name} must be at most {limits.max_n_sequences}, got "
                f"{params.best_of}. To increase this limit, set the "
                "PAGEDKV_MAX_N_SEQUENCES environment variable."
            )
        for name, values, cap, flag in (
            ("stop", params.stop, limits.max_stop_strings, "max_stop_strings"),
            ("bad_words", params.bad_words, limits.max_bad_words, "max_bad_words"),
            ("logit_bias", params.logit_bias, limits.max_logit_bias, "max_logit_bias"),
        ):
            if cap is not None and values and len(values) > cap:
                raise ValueError(
                    f"{name} may have at most {cap} entries, got {len(values)} "
                    f"(the limit is {flag}, set by {where})"
                )
        cap = limits.max_word_chars
        for name, words in (("stop", params.stop), ("bad_words", params.bad_words)):
            longest = max((len(w) for w in words or ()), default=0)
            if cap is not None and longest > cap:
                raise ValueError(
                    f"{name} entries may be at most {cap} characters long, got "
                    f"one of {longest} (the limit is max_word_chars, set by "
                    f"{where})"
                )

    def check_logprobs(self, params: SamplingParams) -> None:
        """vLLM's max_logprobs cap: a huge request fails alone, at once, not inside a step."""
        cap = self.max_logprobs
        for name, kind in (("logprobs", "sample"), ("prompt_logprobs", "prompt")):
            k = getattr(params, name)
            if k is not None and k > cap:
                raise ValueError(
                    f"Requested {kind} logprobs of {k}, which is greater than max "
                    f"allowed: {cap} (parameter={name}, value={k}; the engine "
                    "argument max_logprobs sets the cap)"
                )

    def _check_token_ids(self, params: SamplingParams) -> None:
        """As vLLM: an id outside the vocabulary can never be sampled, and banning it (stop ids
        before min_tokens) or biasing it indexes the logits with it, inside a step."""
        vocab = self.vocab_size
        for name, given in (
            ("stop_token_ids", params.stop_token_ids),
            ("logit_bias", params.logit_bias),
            ("allowed_token_ids", params.allowed_token_ids),
        ):
            bad = sorted({t for t in given or () if not 0 <= t < vocab})
            if bad:
                raise ValueError(
                    f"{name} must be in [0, {vocab}) (the vocabulary size), "
                    f"got out-of-vocab id(s) {bad[:10]}"
                )
            if given and len(given) > vocab:  # only repeats can make a list longer
                raise ValueError(
                    f"{name} has {len(given)} entries, more than the vocabulary ({vocab})"
                )

    def check_priority(self, priority: Any) -> int:
        """ValueError (the server's 400) for a priority the scheduler cannot hold or ignores."""
        if not isinstance(priority, numbers.Integral) or isinstance(priority, bool):
            raise TypeError(
                f"priority must be an integer, got {type(priority).__name__} {priority!r}"
            )
        priority = int(priority)
        if not _INT32[0] <= priority <= _INT32[1]:
            raise ValueError(f"priority must be in [-2**31, 2**31 - 1] (int32), got {priority}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(
                f"Got priority {priority} but Priority scheduling is not enabled. "
                "(Start the engine with scheduling_policy='priority'.)"
            )
        return priority

    # ------------------------------------------------------------------ the prompt
    def _prompt(
        self,
        prompt: Any,
        prompt_token_ids: Optional[Sequence[int]],
        params: SamplingParams,
        limits: RequestLimits,
    ) -> Tuple[Optional[str], List[int], Any]:
        mm_data = None
        if prompt is not None and not isinstance(prompt, str):
            item = prompt_item(prompt, "prompt", self.architecture)
            mm_data = item.get("multi_modal_data")
            prompt = item.get("prompt")
            if prompt_token_ids is None:
                prompt_token_ids = item.get("prompt_token_ids")
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("prompt or prompt_token_ids must be given")
            prompt_token_ids = self.encode_prompt(prompt)
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("prompt must not be empty (it encodes to no tokens)")
        mm = None
        if mm_data is not None:
            if params.truncate_prompt_tokens is not None:  # it would cut image placeholders
                raise ValueError("truncate_prompt_tokens cannot be used with multi_modal_data")
            assert self.images is not None  # (prompt_item refused it otherwise)
            ids, mm = self.images.process(ids, mm_data, "prompt", limits.max_image_pixels)
        ids = self._truncate(ids, params.truncate_prompt_tokens)
        vocab = self.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(
                f"prompt_token_ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}"
            )
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(ids)} tokens long, which does not leave room for "
                f"one generated token within max_model_len={self.max_model_len}"
            )
        return prompt, ids, mm

    def encode_prompt(self, text: str) -> List[int]:
        if self.tokenizer is None:
            raise ValueError("skip_tokenizer_init=True: pass prompt_token_ids, not text")
        _check_unicode(text, "prompt")
        return list(self.tokenizer.encode(text))

    def _truncate(self, ids: List[int], keep: Optional[int]) -> List[int]:
        if keep is None:
            return ids
        max_len = self.max_model_len
        check_truncation(keep, max_len)
        # -1: all the model takes, which here leaves room for one generated token.
        return ids[-(max_len - 1 if keep == -1 else keep) :]

    def _max_tokens(self, ids: List[int], params: SamplingParams) -> int:
        room = self.max_model_len - len(ids)
        return room if params.max_tokens is None else min(params.max_tokens, room)

    def _bad_words(self, params: SamplingParams) -> List[List[int]]:
        if not params.bad_words:
            return []
        tok = self.tokenizer
        for word in params.bad_words:
            _check_unicode(word, "bad_words")
        words = tokenize_bad_words(
            params.bad_words, lambda text: tok.encode(text, add_special_tokens=False)
        )
        wrong = sorted({t for w in words for t in w if not 0 <= t < self.vocab_size})
        if wrong:
            raise ValueError(
                f"bad_words encode to token ids outside the model's "
                f"vocabulary [0, {self.vocab_size}): {wrong[:10]}"
            )
        return words


def check_truncation(keep: int, max_model_len: int) -> None:
    """vLLM's rule (and words) for truncate_prompt_tokens: at most max_model_len."""
    if keep > max_model_len:
        raise ValueError(
            f"truncate_prompt_tokens value ({keep}) is greater than "
            f"max_model_len ({max_model_len}). Please, select a smaller truncation size."
        )


def _check_unicode(text: str, name: str) -> None:
    """ValueError for text that is not valid Unicode (a lone surrogate, which JSON's "\\ud800"
    and Python strings can hold): the tokenizer could not encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} is not valid Unicode: {exc.reason} at character {exc.start}"
        ) from None
