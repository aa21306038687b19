"""Engine-side state of a request: its samples (n / best_of), text, logprobs and finish.

The scheduler owns tokens and KV blocks and decides when a sequence finishes (EOS ids, stop ids,
min_tokens, max_tokens); this side owns what the user sees: detokenized text, stop strings
(which only text can detect), logprobs, and building RequestOutput objects.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from pagedkv.engine.detokenizer import find_stop_string, stop_holdback
from pagedkv.engine.outputs import (
    CompletionOutput,
    PromptLogprobs,
    RequestMetrics,
    RequestOutput,
    SampleLogprobs,
)
from pagedkv.engine.sampling_params import SamplingParams


@dataclass
class SeqState:
    """One sample (completion) of a request; `sched_id` names it in the scheduler."""

    index: int
    sched_id: Optional[str] = None
    generator: Optional[torch.Generator] = None
    token_ids: List[int] = field(default_factory=list)
    logprobs: Optional[SampleLogprobs] = None
    cumulative_logprob: float = 0.0
    detok: Any = None  # IncrementalDetokenizer
    text: str = ""
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None
    matcher: Any = None  # xgrammar GrammarMatcher of a structured-output request

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


def tokenize_bad_words(words: List[str], encode: Any) -> List[List[int]]:
    """vLLM's tokenization of bad words: each word stripped on the left, as the text's start,
    and after a space when that gives a different first token but as many tokens."""
    out: List[List[int]] = []
    for word in words:
        bare = encode(word.lstrip())
        if not bare:
            continue  # nothing to ban (an empty or blank word)
        out.append(bare)
        spaced = encode(" " + word.lstrip())
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out


@dataclass
class RequestState:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    params: SamplingParams
    metrics: RequestMetrics
    max_tokens: int  # after clamping to max_model_len
    eos_token_ids: List[int]
    # SamplingParams.bad_words as token id sequences (tokenize_bad_words builds them).
    bad_words_token_ids: List[List[int]] = field(default_factory=list)
    seqs: List[SeqState] = field(default_factory=list)
    prompt_logprobs: Optional[PromptLogprobs] = None
    forked: bool = False  # the n > 1 samples exist in the scheduler (or finished at once)
    num_cached_tokens: int = 0
    grammar: Any = None  # compiled xgrammar grammar (structured outputs); a matcher per sample
    lora_id: int = 0  # the LoRARequest's lora_int_id (0 = the base model)
    mm: Any = None  # multimodal.MultiModalInputs (images, their embeddings) or None

    # Derived from params once (params do not change after add_request); the per-step loops
    # read these for every sequence of the batch.
    final_only: bool = field(init=False)  # no output until the request finishes
    delta: bool = field(init=False)  # outputs carry only what is new (RequestOutputKind.DELTA)
    # Text is built token by token when someone can see it before the end (streaming) or stop
    # strings must be watched; otherwise it is decoded once at the end.
    incremental_text: bool = field(init=False)
    # Sampling is a plain argmax: greedy, no penalties, no logit bias, no logprobs of any kind.
    plain_greedy: bool = field(init=False)
    # Some token is banned before min_tokens (EOS / stop ids, see banned_tokens).
    bannable: bool = field(init=False)
    # argmax_row holds for every row of every step: one sample, nothing ever banned (read
    # once per request per step by StepSampling, instead of argmax_row's three tests).
    always_argmax: bool = field(init=False)
    # The CompletionOutput last built for each sample (by SeqState.index): reused while the
    # sample does not change, so a streamed step costs the samples that advanced, not all n.
    _shown: Dict[int, CompletionOutput] = field(default_factory=dict, init=False, repr=False)
    # The outputs' copy of the prompt ids: made once, not at every streamed step.
    _prompt_shown: Optional[List[int]] = field(default=None, init=False, repr=False)
    # DELTA: per sample (by SeqState.index), how much was sent already: characters of text,
    # token ids, logprob entries, and whether its finish was reported.
    _sent: Dict[int, Tuple[int, int, int, bool]] = field(
        default_factory=dict, init=False, repr=False
    )
    _prompt_logprobs_sent: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        p = self.params
        self.final_only = p.output_kind == "final_only"
        self.delta = p.output_kind == "delta"
        self.incremental_text = bool(p.detokenize and (p.stop or not self.final_only))
        self.plain_greedy = (
            p.sampling_type_greedy
            and p.logprobs is None
            and p.prompt_logprobs is None
            and p.best_of == p.n
            and p.repetition_penalty == 1.0
            and p.presence_penalty == 0.0
            and p.frequency_penalty == 0.0
            and not p.logit_bias
            and p.allowed_token_ids is None
            and not self.bad_words_token_ids
            and p.structured_outputs is None
            and not p.logits_processors
        )
        self.bannable = bool(p.stop_token_ids or (not p.ignore_eos and self.eos_token_ids))
        self.always_argmax = (
            self.plain_greedy and p.n == 1 and (not self.bannable or p.min_tokens <= 0)
        )

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.seqs)

    def argmax_row(self, seq: SeqState) -> bool:
        """This step's row of `seq` is sampled by a plain argmax (StepSampling's fast path):
        greedy without knobs, one row (no n > 1 prompt completion), nothing banned."""
        return (
            self.plain_greedy
            and (self.forked or len(self.seqs) == 1 or bool(seq.token_ids))
            and (not self.bannable or len(seq.token_ids) >= self.params.min_tokens)
        )

    # ------------------------------------------------------------ stop rules
    def banned_tokens(self, seq: SeqState) -> List[int]:
        """EOS and stop ids cannot be sampled before min_tokens (as vLLM's logits processor);
        nor the last token of a bad word whose other tokens end the output (vLLM matches the
        output only, not the prompt)."""
        out = seq.token_ids
        banned: List[int] = []
        if len(out) < self.params.min_tokens:
            banned += self.params.stop_token_ids or []
            if not self.params.ignore_eos:
                banned += self.eos_token_ids
        for word in self.bad_words_token_ids:
            k = len(word) - 1
            if k == 0 or (len(out) >= k and out[len(out) - k :] == word[:k]):
                banned.append(word[-1])
        return banned

    def check_stop_strings(self, seq: SeqState, new_text_len: int) -> bool:
        """Finds a stop string in the newly added text; truncates and finishes on a match."""
        p = self.params
        if not p.stop or len(seq.token_ids) < p.min_tokens:
            return False
        hit = find_stop_string(
            seq.text,
            new_text_len,
            p.stop,  # type: ignore[arg-type]
            p.include_stop_str_in_output,
        )
        if hit is None:
            return False
        seq.text = seq.text[: hit[1]]
        seq.finish_reason, seq.stop_reason = "stop", hit[0]
        return True

    # ------------------------------------------------------------ outputs
    def _visible_text(self, seq: SeqState) -> str:
        # While running, hold back a tail that could still become a stop string, so streamed
        # text never shows a stop string's prefix (vLLM does the same).
        p = self.params
        if seq.finished or not p.stop or p.include_stop_str_in_output:
            return seq.text
        hold = stop_holdback(seq.text, p.stop)  # type: ignore[arg-type]
        return seq.text[: len(seq.text) - hold] if hold else seq.text

    def _completion(self, s: SeqState, index: int, want_logprob: bool) -> CompletionOutput:
        """The sample as a CompletionOutput of its own (lists copied: the engine goes on
        appending to the sample's), or the one built last time if the sample has not changed
        since (outputs are cumulative: same token count, finish and text mean the same)."""
        text = self._visible_text(s)
        last = self._shown.get(s.index)
        if (
            last is not None
            and last.index == index
            and len(last.token_ids) == len(s.token_ids)
            and last.finish_reason == s.finish_reason
            and last.text == text
        ):
            return last
        c = self._shown[s.index] = CompletionOutput(
            index=index,
            text=text,
            token_ids=list(s.token_ids),
            cumulative_logprob=s.cumulative_logprob if want_logprob else None,
            logprobs=list(s.logprobs) if s.logprobs is not None else None,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
        )
        return c

    def _delta(self, s: SeqState, index: int, want_logprob: bool) -> Optional[CompletionOutput]:
        """DELTA: what the sample added since its last output (None when nothing, not even
        its finish, is new). cumulative_logprob stays cumulative, as in vLLM."""
        text = self._visible_text(s)
        n_text, n_tok, n_lp, told_finish = self._sent.get(s.index, (0, 0, 0, False))
        lps = s.logprobs
        if (
            len(text) == n_text
            and len(s.token_ids) == n_tok
            and (s.finish_reason is None or told_finish)
        ):
            return None
        self._sent[s.index] = (
            len(text),
            len(s.token_ids),
            len(lps) if lps is not None else 0,
            s.finish_reason is not None,
        )
        return CompletionOutput(
            index=index,
            text=text[n_text:],
            token_ids=s.token_ids[n_tok:],
            cumulative_logprob=s.cumulative_logprob if want_logprob else None,
            logprobs=lps[n_lp:] if lps is not None else None,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
        )

    def to_output(self) -> RequestOutput:
        finished = self.finished
        seqs = self.seqs
        best_of = self.params.best_of or self.params.n  # set by SamplingParams.__post_init__
        want_logprob = self.params.logprobs is not None or best_of > self.params.n
        if finished and best_of > self.params.n:
            seqs = sorted(seqs, key=lambda s: -s.cumulative_logprob)[: self.params.n]
        if self.delta:
            outs = [
                c
                for c in (
                    self._delta(s, i if len(seqs) < len(self.seqs) else s.index, want_logprob)
                    for i, s in enumerate(seqs)
                )
                if c is not None
            ]
        else:
            outs = [
                self._completion(s, i if len(seqs) < len(self.seqs) else s.index, want_logprob)
                for i, s in enumerate(seqs)
            ]
        if finished and self.metrics.finished_time is None:
            self.metrics.finished_time = time.time()
        if self._prompt_shown is None:
            self._prompt_shown = list(self.prompt_token_ids)
        prompt_logprobs = (
            list(self.prompt_logprobs)
            if self.prompt_logprobs is not None and not self._prompt_logprobs_sent
            else None
        )
        self._prompt_logprobs_sent = self.delta  # DELTA sends them once, with the first output
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self._prompt_shown,
            prompt_logprobs=prompt_logprobs,
            # A snapshot: the engine goes on updating the request's metrics after this output
            # is handed out, and an output must keep describing the step that made it.
            outputs=outs,
            finished=finished,
            metrics=dataclasses.replace(self.metrics),
            num_cached_tokens=self.num_cached_tokens,
        )
