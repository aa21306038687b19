"""Structured outputs on xgrammar: the request-side parameters, the grammar cache, the
per-sample matchers and the token bitmask.

A request's constraint (a JSON schema, any JSON object, a regex, a list of choices or an EBNF
grammar) is compiled once per distinct spec into an xgrammar ``CompiledGrammar`` and cached.
Compiling happens where the request is checked (InputProcessor.process), which AsyncLLMEngine
and the server run in worker threads: that request waits for its grammar, the running batch
does not. A spec xgrammar refuses raises ``ValueError`` naming ``structured_outputs`` there, so
the server answers 400.

Each sample (n > 1: each of them) owns a ``GrammarMatcher``, advanced on every token the engine
accepts (one batched call per step). The next bitmask is filled in a worker thread while the
host processes outputs and schedules and the device runs the forward (structured_bitmask.py);
it goes to the device without a host wait and is applied to the logits in place by
xgrammar's ``apply_token_bitmask_inplace``. A matcher that reaches its grammar's end finishes
the sample. Preemption by recompute keeps a sample's output tokens, so its matcher stays valid.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:  # SamplingParams imports this module: it must not need torch
    import torch

# The longest whitespace run a JSON answer may hold between tokens (unless
# disable_any_whitespace): room for newlines and nested indentation, yet a model cannot loop on
# whitespace until max_tokens (a known failure of unbounded JSON whitespace).
MAX_JSON_WHITESPACE = 12

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


@dataclass
class StructuredOutputsParams:
    """vLLM's StructuredOutputsParams: exactly one of the constraint fields is set."""

    json: Optional[Union[str, Dict[str, Any]]] = None  # a JSON schema (dict or its text)
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None  # EBNF (xgrammar / GBNF syntax)
    json_object: Optional[bool] = None  # any JSON object
    structural_tag: Optional[str] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None

    def __post_init__(self) -> None:
        set_ = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(set_) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, "
                f"grammar, json_object, structural_tag; got {set_ or 'none'}"
            )
        if self.json is not None and not isinstance(self.json, (str, dict)):
            raise TypeError(
                "structured_outputs.json must be a JSON schema (dict or string), "
                f"got {type(self.json).__name__}"
            )
        if self.regex is not None and not isinstance(self.regex, str):
            raise TypeError("structured_outputs.regex must be a string")
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise TypeError("structured_outputs.grammar must be a string")
        if self.choice is not None:
            if not (
                isinstance(self.choice, (list, tuple))
                and self.choice
                and all(isinstance(c, str) and c for c in self.choice)
            ):
                raise ValueError(
                    "structured_outputs.choice must be a non-empty list of non-empty strings"
                )
            self.choice = list(self.choice)
        if self.structural_tag is not None:
            raise ValueError(
                "structured_outputs.structural_tag is not supported; use json, "
                "regex, choice, grammar or json_object"
            )
        if self.whitespace_pattern is not None:
            raise ValueError(
                "structured_outputs.whitespace_pattern is not supported (xgrammar "
                "takes disable_any_whitespace instead)"
            )

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    def key(self) -> Tuple[str, str, bool, bool]:
        """What identifies the compiled grammar (the cache key)."""
        kind = self.kind
        spec = getattr(self, kind)
        if kind == "json":
            spec = json.loads(spec) if isinstance(spec, str) else spec
            spec = json.dumps(spec, sort_keys=True)
        elif kind == "choice":
            spec = json.dumps(spec)
        return (kind, str(spec), self.disable_any_whitespace, self.disable_additional_properties)


@dataclass
class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older spelling (SamplingParams.guided_decoding); ``backend`` must be xgrammar."""

    backend: Optional[str] = None

    def __post_init__(self) -> None:
        if self.backend not in (None, "auto", "xgrammar") and not str(self.backend).startswith(
            "xgrammar"
        ):
            raise ValueError(
                f"guided_decoding.backend {self.backend!r} is not supported; "
                "pagedkv decodes with xgrammar"
            )
        super().__post_init__()

    def to_structured(self) -> StructuredOutputsParams:
        names = [f.name for f in fields(StructuredOutputsParams)]
        return StructuredOutputsParams(**{n: getattr(self, n) for n in names})


def choice_grammar(choices: Sequence[str]) -> str:
    """An EBNF grammar matching exactly one of the choices (xgrammar string literals take
    JSON's escapes)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarCache:
    """Compiles each distinct spec once (xgrammar GrammarCompiler) for one tokenizer."""

    def __init__(
        self,
        hf_tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Sequence[int],
        max_threads: int = 4,
    ) -> None:
        self._hf, self._stop, self._threads = hf_tokenizer, list(stop_token_ids), max_threads
        self.vocab_size = int(vocab_size)
        self._compiler: Any = None  # built at the first structured request (seconds of work)
        self._cache: Dict[Tuple[str, str, bool, bool], Any] = {}
        self._lock = threading.Lock()
        self._batch: Any = None  # xgrammar's BatchGrammarMatcher, made at the first fill
        self.stop_token_ids: frozenset = frozenset()  # (known once the compiler is built)

    def _compiler_ready(self) -> Any:
        with self._lock:
            if self._compiler is None:
                import xgrammar as xgr

                self._xgr = xgr
                info = xgr.TokenizerInfo.from_huggingface(
                    self._hf, vocab_size=self.vocab_size, stop_token_ids=self._stop or None
                )
                self._compiler = xgr.GrammarCompiler(info, max_threads=self._threads)
                # The tokens that end a grammar: a matcher terminates exactly when it takes one.
                self.stop_token_ids = frozenset(int(t) for t in info.stop_token_ids)
            return self._compiler

    def get(self, spec: StructuredOutputsParams) -> Any:
        """The CompiledGrammar of ``spec``; ValueError (naming structured_outputs) when
        xgrammar refuses it. Thread-safe; compiles each key once in the common case."""
        try:
            key = spec.key()
            with self._lock:
                hit = self._cache.get(key)
            if hit is not None:
                return hit
            compiled = self._compile(spec)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(
                f"structured_outputs.{spec.kind} was refused by the grammar "
                f"compiler: {str(exc).strip().splitlines()[0][:300]}"
            ) from None
        with self._lock:
            return self._cache.setdefault(key, compiled)

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        c, kind = self._compiler_ready(), spec.kind
        whitespace = not spec.disable_any_whitespace
        if kind == "json":
            schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
            # strict_mode: no properties or items beyond what the schema names.
            return c.compile_json_schema(
                schema,
                any_whitespace=whitespace,
                strict_mode=True,
                max_whitespace_cnt=MAX_JSON_WHITESPACE,
            )
        if kind == "json_object":
            # Any JSON object (OpenAI's json_object), not any JSON value.
            return c.compile_json_schema(
                '{"type": "object"}',
                any_whitespace=whitespace,
                strict_mode=False,
                max_whitespace_cnt=MAX_JSON_WHITESPACE,
            )
        if kind == "regex":
            return c.compile_regex(spec.regex)
        if kind == "choice":
            return c.compile_grammar(choice_grammar(spec.choice or []))
        return c.compile_grammar(spec.grammar)

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

    # ---------------------------------------------------------------- bitmask
    def fill_bitmask(self, matchers: Sequence[Any]) -> Optional[torch.Tensor]:
        """[rows, vocab/32] int32 bitmask on the CPU (rows without a matcher, or whose matcher
        has terminated, allow every token), or None when no row is constrained. One batched
        xgrammar call over every live matcher: it spreads the rows over threads and measured
        3.6 ms -> 0.25 ms for 64 JSON-schema rows on 2 cores (one call per row cost more than
        a SmolLM2 decode step on the H200). The engine runs it in a worker thread
        (structured_bitmask.py): the batch fill releases the GIL."""
        if all(m is None for m in matchers):
            return None
        mask = self._xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        rows = [i for i, m in enumerate(matchers) if m is not None and not m.is_terminated()]
        if rows:
            self.fill_rows([matchers[i] for i in rows], mask, rows)
        return mask

    def fill_rows(self, matchers: Sequence[Any], mask: torch.Tensor, rows: List[int]) -> None:
        """The bitmask of each (live) matcher into its row of ``mask``: xgrammar's batch call
        alone (it releases the GIL), for fill_bitmask and the engine's worker thread."""
        if self._batch is None:
            # (no more threads than the machine has: xgrammar warns and clamps)
            self._batch = self._xgr.BatchGrammarMatcher(
                max_threads=max(1, min(self._threads, os.cpu_count() or 1))
            )
        self._batch.batch_fill_next_token_bitmask(list(matchers), mask, rows)

    def apply_bitmask(self, logits: torch.Tensor, mask: torch.Tensor) -> None:
        """Disallowed tokens -> -inf, in place (logits: [rows, >= vocab] float32; ``mask``
        already on the logits' device where the engine calls it: structured_bitmask.py)."""
        self._xgr.apply_token_bitmask_inplace(
            logits,
            mask.to(logits.device, non_blocking=True),
            vocab_size=min(self.vocab_size, logits.shape[1]),
        )


def accept_tokens(matchers: Sequence[Any], tokens: Sequence[int]) -> List[int]:
    """Each matcher takes its token, in one xgrammar call (C++, without the GIL); the
    positions of those refused (a token sampled under the mask is always taken: a refusal is
    an engine bug)."""
    import xgrammar as xgr

    taken = xgr.BatchGrammarMatcher.batch_accept_token(list(matchers), list(tokens))
    return [i for i, ok in enumerate(taken) if not ok]


def refused_token_error(token: int) -> RuntimeError:
    return RuntimeError(
        f"structured output: token {token} was sampled but the grammar does not allow it"
    )


def apply_logits_processors(
    logits: torch.Tensor,
    processors: Sequence[Any],
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> None:
    """vLLM's per-request logits processors on one row, in place: each is ``f(output_ids,
    logits)`` or ``f(prompt_ids, output_ids, logits)`` and returns the new row."""
    import torch

    with torch.inference_mode():  # the step's logits are inference tensors
        _run_processors(logits, processors, prompt_ids, output_ids)


def _run_processors(
    row: torch.Tensor,
    processors: Sequence[Any],
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
) -> None:
    for fn in processors:
        if _arity(fn) == 3:
            out = fn(list(prompt_ids), list(output_ids), row)
        else:
            out = fn(list(output_ids), row)
        if out is not row:
            row.copy_(out)


def _arity(fn: Any) -> int:
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    return sum(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        for p in params
    )
