"""What the completion and chat handlers check in a request before any work, and how a request
becomes SamplingParams. The rules that do not depend on HTTP (ranges, vocabulary, limits) are
the engine's InputProcessor's; these are the API's own (fields pagedkv does not implement,
OpenAI's field names and vLLM's messages)."""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Sequence

from pagedkv.engine.input_processor import check_truncation
from pagedkv.entrypoints.openai.errors import APIError, bad_request, field_named_in
from pagedkv.entrypoints.openai.structured_request import FIELDS as STRUCTURED_FIELDS
from pagedkv.entrypoints.openai.structured_request import structured_outputs_of

logger = logging.getLogger("pagedkv.server")

# Request fields passed to SamplingParams under the same name when the client set them.
_SAMPLING_FIELDS = (
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "spaces_between_special_tokens",
    "allowed_token_ids",
    "bad_words",
)

# The most logprobs a request may ask for per token when the engine does not say (vLLM's
# default max_logprobs); a served engine's own cap (--max-logprobs) is ServerState.max_logprobs.
MAX_LOGPROBS = 20


def is_unset(value: Any) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def text_format(value: Any) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "text")


def no_tool_choice(value: Any) -> bool:
    return value is None or value == "none"


# Request fields of OpenAI / vLLM that would change the output but that pagedkv does not
# implement: a request that sets one gets a 400 "<field> is not supported" instead of an answer
# that silently ignores it. Field -> "this value is harmless" (unset / the default behaviour).
# Fields of both endpoints; the chat endpoint adds its own (serving_chat.py).
UNSUPPORTED: Dict[str, Callable[[Any], bool]] = {
    "logits_processors": is_unset,
    "prompt_embeds": is_unset,
    "structural_tag": is_unset,
    # vLLM isolates the prefix cache of requests with a salt; ignoring it would share cached
    # prompts across the tenants it is meant to separate.
    "cache_salt": is_unset,
}


class RequestChecks:
    state: Any
    engine: Any
    tokenizer: Any

    def check_model(self, model: Optional[str]) -> None:
        if model in (None, "") or model in self.state.served_model_names:
            return
        if model.lower() in {a.lower() for a in self.state.model_aliases}:
            return
        lora = getattr(self.state, "lora", None)
        if lora is not None and lora.get(model) is not None:
            return
        raise APIError(
            404,
            f"The model `{model}` does not exist. Served models: "
            f"{', '.join(self.state.served_model_names)}",
            param="model",
            code="model_not_found",
        )

    def truncation(self, req: Any) -> Optional[int]:
        """vLLM's truncate_prompt_tokens: keep the prompt's last k tokens (-1: max_model_len);
        None: no truncation."""
        k = getattr(req, "truncate_prompt_tokens", None)
        limit = self.state.max_model_len
        if k is None:
            return None
        if k == -1:
            return limit
        if k < 1:
            raise bad_request(
                f"truncate_prompt_tokens must be >= 1 or -1, got {k}",
                param="truncate_prompt_tokens",
            )
        try:  # the InputProcessor's rule, checked before the text is tokenized
            check_truncation(k, limit)
        except ValueError as exc:
            raise bad_request(str(exc), param="truncate_prompt_tokens") from None
        return k

    def check_supported(
        self, req: Any, extra: Optional[Dict[str, Callable[[Any], bool]]] = None
    ) -> None:
        """400 for a field pagedkv does not implement (UNSUPPORTED), set to a value that would
        change the output, rather than an answer that ignores it."""
        for name, harmless in {**UNSUPPORTED, **(extra or {})}.items():
            value = getattr(req, name, None)
            if not harmless(value):
                shown = repr(value)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."  # tools can be long
                raise bad_request(f"{name} is not supported (got {shown})", param=name)

    def check_request(self, req: Any, handled: Sequence[str] = ()) -> None:
        """What both endpoints check before any work, as vLLM does. ``handled``: the extra
        (undeclared) fields the endpoint checks itself."""
        self.check_supported(req)
        # Fields pagedkv does not know are ignored; vLLM logs them, so a client can see why a
        # setting had no effect (e.g. OpenAI's `verbosity`, which vLLM does not implement).
        ignored = sorted(
            set(req.model_extra or ()) - set(UNSUPPORTED) - set(handled) - set(STRUCTURED_FIELDS)
        )
        if ignored:
            logger.warning(
                "The following fields were present in the request but ignored: %s",
                ", ".join(ignored),
            )
        beams = getattr(req, "use_beam_search", False)  # serving_beam_search.py's checks
        if req.best_of is not None and req.best_of > req.n and req.stream and not beams:
            # The best samples are known only at the end (OpenAI's rule too).
            raise bad_request("best_of > n cannot be streamed", param="best_of")
        # A present, non-empty stream_options without stream (vLLM lets {} through).
        so = req.stream_options
        if so is not None and so.model_fields_set and not req.stream:
            raise bad_request(
                "Stream options can only be defined when `stream=True`.", param="stream_options"
            )
        if req.prompt_logprobs is not None:
            self.check_logprobs(req.prompt_logprobs, "prompt_logprobs")
            if req.stream and req.prompt_logprobs > 0:
                raise bad_request(
                    "`prompt_logprobs` are not available when `stream=True`.",
                    param="prompt_logprobs",
                )

    def check_logprobs(self, value: Optional[int], param: str) -> None:
        """A logprobs count in [0, the engine's --max-logprobs] (400 naming ``param``)."""
        cap = self.state.max_logprobs
        if value is not None and not 0 <= value <= cap:
            raise bad_request(
                f"{param} must be in [0, {cap}], got {value} (the server's "
                "--max-logprobs sets the cap)",
                param=param,
            )

    def logit_bias(self, bias: Optional[Dict[str, float]]) -> Optional[Dict[int, float]]:
        """The request's logit_bias as SamplingParams takes it: integer token ids (JSON keys
        are strings), each in the model's vocabulary, values clamped to [-100, 100] as OpenAI
        and vLLM do."""
        if not bias:
            return None
        ids: Dict[int, float] = {}
        for key, value in bias.items():
            try:
                ids[int(key)] = min(100.0, max(-100.0, float(value)))
            except ValueError:
                raise bad_request(
                    f"logit_bias keys must be token ids (integers), got {key!r}", param="logit_bias"
                ) from None
        return ids  # ids outside the vocabulary: the InputProcessor's 400

    def check_ids(self, ids: Sequence[int], param: str) -> None:
        if not ids:
            raise bad_request("the prompt is empty", param=param)
        vocab = getattr(self.tokenizer, "vocab_size", None)
        bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            raise bad_request(f"token id {bad[0]} is out of range [0, {vocab})", param=param)

    def check_n(self, n: int) -> None:
        """`n` is an int (pydantic checked that) of at least 1; the InputProcessor applies the
        server's upper limit."""
        if n < 1:
            raise bad_request(f"n must be at least 1, got {n}", param="n")

    def max_tokens_for(
        self,
        prompt_len: int,
        requested: Optional[int],
        param: str = "max_tokens",
        prompt_param: str = "prompt",
    ) -> int:
        """vLLM's rule: prompt + completion must fit the context; no max_tokens = the rest.
        ``param`` / ``prompt_param``: the request fields errors name."""
        limit = self.state.max_model_len
        if requested is not None and requested < 1:
            raise bad_request(f"{param} must be at least 1, got {requested}", param=param)
        if prompt_len >= limit or (requested is not None and prompt_len + requested > limit):
            asked = prompt_len + (requested or 0)
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {asked} tokens ({prompt_len} in the prompt, {requested or 0} in "
                "the completion). Please reduce the length of the prompt or completion.",
                param=param if prompt_len < limit else prompt_param,
            )
        return requested if requested is not None else limit - prompt_len

    def sampling_params(
        self,
        req: Any,
        max_tokens: int,
        logprobs: Optional[int],
        prompt_logprobs: Optional[int] = None,
        fields: Optional[Dict[str, str]] = None,
    ) -> Any:
        """SamplingParams of one prompt. ``fields`` maps a SamplingParams argument to the
        request field it came from where the two differ (chat: logprobs <- top_logprobs), so
        that a rejected value's 400 names the field the client sent."""
        from pagedkv.engine.sampling_params import SamplingParams

        # The model's generation_config.json defaults (--generation-config), under what the
        # request sets; its max_new_tokens caps a request that names no length (vLLM's rule).
        defaults = dict(
            getattr(getattr(self.engine, "model_config", None), "generation_defaults", None) or {}
        )
        default_max = defaults.pop("max_tokens", None)
        if default_max is not None and all(
            getattr(req, f, None) is None for f in ("max_tokens", "max_completion_tokens")
        ):
            max_tokens = min(max_tokens, int(default_max))
        kwargs: Dict[str, Any] = {**defaults, "max_tokens": max_tokens}
        for name in _SAMPLING_FIELDS:
            value = getattr(req, name, None)
            if value is not None:
                kwargs[name] = value
        if isinstance(kwargs.get("stop"), str):
            kwargs["stop"] = [kwargs["stop"]]
        if logprobs is not None:
            kwargs["logprobs"] = logprobs
        if prompt_logprobs is not None:
            kwargs["prompt_logprobs"] = prompt_logprobs
        bias = self.logit_bias(getattr(req, "logit_bias", None))
        if bias:
            kwargs["logit_bias"] = bias
        structured = structured_outputs_of(req)
        if structured is not None:
            kwargs["structured_outputs"] = structured
        self.check_n(req.n)
        names = {name: name for name in kwargs}
        names.update(fields or {})
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise bad_request(str(exc), param=field_named_in(str(exc), names)) from exc
