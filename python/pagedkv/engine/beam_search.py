"""Beam search over the engine (vLLM's LLM.beam_search API, HF's beam scorer semantics).

Each step, every live beam of every prompt is one engine request for a single greedy token
with the top ``2 x beam_width`` logprobs (vLLM's design); this module ranks the candidates and
keeps the best beams. Why requests rather than the scheduler's copy-on-write ``fork()``: a
fork continues a sequence with the token the engine samples, while beam search must choose the
continuations itself from the candidates of all beams, and may drop a beam or continue one
several ways. Whole requests need nothing but the engine's public API (add_request / generate)
and still share memory: a beam's prompt is its parent's prompt plus one token, so its full KV
blocks are hits in the C++ prefix cache (the allocator hands the same physical blocks to every
beam with that prefix); only the tail of the last, partial block is recomputed per step.

Scoring is HF transformers' (``generate(num_beams=k, do_sample=False, length_penalty=lp)`` with
its default ``early_stopping=False``): a hypothesis ending in EOS, or reaching max_tokens, is
scored ``cum_logprob / num_generated_tokens ** lp`` (the EOS counted); it is kept only if its
candidate ranks among the step's best ``beam_width``; the search stops at max_tokens or when the
best running beam, scored at its current length, cannot beat the worst of ``beam_width``
finished hypotheses.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from pagedkv.engine.outputs import Logprob
from pagedkv.engine.sampling_params import SamplingParams

StepLogprobs = Dict[int, Logprob]  # one position's {token id: Logprob}, top-k of a beam


@dataclass
class BeamSearchParams:
    """vLLM's BeamSearchParams. ``temperature`` must stay 0.0: beams are ranked by the raw
    model log-probabilities (the engine's logprobs), which a temperature would not change."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("temperature", "length_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value!r}")
        if self.temperature != 0.0:
            raise ValueError(
                f"temperature must be 0.0 for beam search, got {self.temperature!r} (beams are "
                "ranked by the raw model logprobs; sampled beam search is not supported)"
            )


@dataclass
class BeamSearchSequence:
    """One hypothesis (vLLM's names): ``tokens`` holds the prompt and the generated tokens
    (the EOS that ended it included); ``logprobs`` one entry per generated token: that step's
    top logprobs of the beam, the chosen token among them."""

    tokens: List[int]
    logprobs: List[StepLogprobs]
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None  # "stop" (EOS) | "length"
    stop_reason: Optional[int] = None
    num_prompt_tokens: int = 0

    @property
    def generated_token_ids(self) -> List[int]:
        return self.tokens[self.num_prompt_tokens :]


@dataclass
class BeamSearchOutput:
    """The finished hypotheses of one prompt, best score first (beam_width of them)."""

    sequences: List[BeamSearchSequence]


def beam_score(cum_logprob: float, num_generated: int, length_penalty: float) -> float:
    """HF's length-normalised score of a finished hypothesis. An extreme (finite) penalty
    saturates as HF's float math does (the length factor becomes inf or 0) instead of raising
    OverflowError or ZeroDivisionError in Python's float power and division."""
    try:
        factor = float(num_generated) ** length_penalty
    except OverflowError:
        factor = math.inf
    if factor == 0.0:
        return -math.inf if cum_logprob < 0 else 0.0
    return cum_logprob / factor


@dataclass
class _Beam:
    tokens: List[int] = field(default_factory=list)  # generated only
    logprobs: List[StepLogprobs] = field(default_factory=list)
    cum: float = 0.0

    def extended(self, tok: int, step: StepLogprobs, cum: float) -> _Beam:
        return _Beam(self.tokens + [tok], self.logprobs + [step], cum)


class BeamSearch:
    """The search of one prompt: ``pending()`` lists the token ids each live beam asks the
    engine about, ``advance()`` takes one top-logprobs dict per beam, ``output()`` the result.
    """

    def __init__(
        self,
        prompt_token_ids: Sequence[int],
        params: BeamSearchParams,
        eos_token_ids: Iterable[int],
        max_tokens: int,
    ) -> None:
        self.prompt = list(prompt_token_ids)
        self.params = params
        self.eos = frozenset(() if params.ignore_eos else (int(t) for t in eos_token_ids))
        self.max_tokens = max_tokens
        self.num_candidates = num_candidates(params, len(self.eos))
        self.running: List[_Beam] = [_Beam()]  # HF starts from one beam (the others at -1e9)
        self.finished: List[Tuple[float, _Beam, str]] = []  # (score, beam, reason), best first
        self.num_generated = 0

    @property
    def done(self) -> bool:
        return not self.running

    def pending(self) -> List[List[int]]:
        return [self.prompt + b.tokens for b in self.running]

    def step_params(self) -> SamplingParams:
        return step_params(self.num_candidates)

    def advance(self, steps: Sequence[StepLogprobs]) -> None:
        """One step: ``steps[i]`` is the top logprobs of the next token of ``running[i]``."""
        if len(steps) != len(self.running):
            raise ValueError(f"{len(steps)} logprob entries for {len(self.running)} beams")
        width, keep = self.params.beam_width, self.num_candidates
        candidates = []
        for beam, step in zip(self.running, steps):
            top = sorted(step.items(), key=lambda kv: -kv[1].logprob)[:keep]
            candidates += [(beam.cum + lp.logprob, beam, tok, step) for tok, lp in top]
        candidates.sort(key=lambda c: -c[0])  # stable: ties keep beam, then rank, order
        self.num_generated += 1
        at_limit = self.num_generated >= self.max_tokens
        running: List[_Beam] = []
        for rank, (cum, beam, tok, step) in enumerate(candidates[:keep]):
            if tok in self.eos or at_limit:
                if rank < width:  # HF keeps only hypotheses among the step's best beam_width
                    reason = "stop" if tok in self.eos else "length"
                    self._finish(beam.extended(tok, step, cum), reason)
            elif len(running) < width:
                running.append(beam.extended(tok, step, cum))
        self.running = [] if at_limit or not self._can_improve(running) else running

    def _finish(self, beam: _Beam, reason: str) -> None:
        score = beam_score(beam.cum, len(beam.tokens), self.params.length_penalty)
        self.finished.append((score, beam, reason))
        self.finished.sort(key=lambda f: -f[0])
        del self.finished[self.params.beam_width :]

    def _can_improve(self, running: List[_Beam]) -> bool:
        """HF's stopping heuristic (early_stopping=False): go on while fewer than beam_width
        hypotheses are finished, or the best running beam scored at its current length beats
        the worst of them."""
        if not running:
            return False
        if len(self.finished) < self.params.beam_width:
            return True
        best = beam_score(running[0].cum, self.num_generated, self.params.length_penalty)
        return best > self.finished[-1][0]

    def output(self, decode: Optional[Callable[[List[int]], str]]) -> BeamSearchOutput:
        """The finished hypotheses, best first; ``decode`` (None: no text) turns generated
        token ids into text, the EOS left out unless include_stop_str_in_output."""
        seqs = []
        for _, beam, reason in self.finished:
            shown = beam.tokens
            if reason == "stop" and not self.params.include_stop_str_in_output:
                shown = shown[:-1]
            seqs.append(
                BeamSearchSequence(
                    tokens=self.prompt + beam.tokens,
                    logprobs=beam.logprobs,
                    cum_logprob=beam.cum,
                    text=decode(shown) if decode is not None else None,
                    finish_reason=reason,
                    num_prompt_tokens=len(self.prompt),
                )
            )
        return BeamSearchOutput(sequences=seqs)


def num_candidates(params: BeamSearchParams, num_eos: int) -> int:
    """HF's beams_to_keep: enough candidates a step that beam_width of them are not EOS."""
    return max(2, 1 + (0 if params.ignore_eos else num_eos)) * params.beam_width


def step_params(num_logprobs: int) -> SamplingParams:
    """A beam's request: one greedy token with the top candidates' logprobs, no text."""
    return SamplingParams(
        temperature=0.0,
        max_tokens=1,
        logprobs=num_logprobs,
        ignore_eos=True,
        detokenize=False,
        output_kind="final_only",
    )


def first_logprobs(out: Any) -> StepLogprobs:
    """The top logprobs of the one token a beam request generated."""
    logprobs = out.outputs[0].logprobs
    if not logprobs:
        raise RuntimeError(f"beam request {out.request_id} came back without logprobs")
    return logprobs[0]


def check_width(params: BeamSearchParams, num_eos: int, max_logprobs: int) -> None:
    """Each beam needs its top (HF's) 2 x beam_width candidates (more with several EOS ids)
    from the engine, which caps logprobs at max_logprobs."""
    need = num_candidates(params, num_eos)
    if need > max_logprobs:
        raise ValueError(
            f"beam_width={params.beam_width} needs the top {need} logprobs of each beam per "
            f"step, more than the engine's max_logprobs={max_logprobs} (the engine argument "
            "max_logprobs sets the cap)"
        )


async def beam_search_async(
    engine: Any,
    request_id: str,
    prompt_token_ids: List[int],
    params: BeamSearchParams,
    lora_request: Any = None,
    decode: Optional[Callable[[List[int]], str]] = None,
    priority: int = 0,
) -> BeamSearchOutput:
    """Beam search of one tokenized prompt on an AsyncLLMEngine (the server's path): each
    step's beam requests run concurrently with everything else the engine serves. Cancelling
    the call aborts the step's requests (their streams close). ``decode``: generated ids ->
    text (default: the engine's decoder, special tokens skipped; None without a tokenizer);
    the prompt must leave room for params.max_tokens (the server checks it)."""
    core = engine.engine
    search = BeamSearch(prompt_token_ids, params, core.eos_token_ids, params.max_tokens)
    kw = {"lora_request": lora_request} if lora_request is not None else {}
    step = 0

    async def one(i: int, ids: List[int]) -> StepLogprobs:
        final = None
        async for out in engine.generate(
            ids, search.step_params(), f"{request_id}-beam{step}.{i}", priority=priority, **kw
        ):
            final = out  # cumulative outputs: the last one is the finished request
        return first_logprobs(final)

    while not search.done:
        steps = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(search.pending())))
        search.advance(steps)
        step += 1
    if decode is None and getattr(core, "decoder", None) is not None:
        decode = core.decoder.decode
    return search.output(decode)


def beam_search_sync(
    llm: Any,
    items: List[Dict[str, Any]],
    params: BeamSearchParams,
    loras: List[Any],
    bar: Any = None,
) -> List[BeamSearchOutput]:
    """LLM.beam_search: all prompts' beams of a step go to the engine in one ``generate`` (one
    batch); the first step sends the prompts as given, so that the engine tokenizes and checks
    them as generate() would."""
    engine = llm.llm_engine
    eos = engine.eos_token_ids
    check_width(params, len(eos), engine.input_processor.max_logprobs)
    step = step_params(num_candidates(params, len(eos)))
    firsts = llm.generate(items, step, use_tqdm=False, lora_request=loras)
    limit = engine.model_config.max_model_len
    searches = []
    for out in firsts:
        room = limit - len(out.prompt_token_ids)  # the engine's clamp, as in generate()
        search = BeamSearch(out.prompt_token_ids, params, eos, min(params.max_tokens, room))
        search.advance([first_logprobs(out)])
        searches.append(search)
    shown: set = set()  # the searches the bar has counted
    _advance_bar(bar, searches, shown)
    while True:
        live = [(i, s) for i, s in enumerate(searches) if not s.done]
        if not live:
            break
        prompts, owners, step_loras = [], [], []
        for i, s in live:
            for ids in s.pending():
                prompts.append({"prompt_token_ids": ids})
                owners.append(s)
                step_loras.append(loras[i])
        outs = llm.generate(prompts, step, use_tqdm=False, lora_request=step_loras)
        by_search: Dict[int, List[StepLogprobs]] = {}
        for s, out in zip(owners, outs):
            by_search.setdefault(id(s), []).append(first_logprobs(out))
        for _, s in live:
            s.advance(by_search[id(s)])
        _advance_bar(bar, searches, shown)
    decoder = engine.decoder
    return [s.output(decoder.decode if decoder is not None else None) for s in searches]


def _advance_bar(bar: Any, searches: List[BeamSearch], shown: set) -> None:
    if bar is None:
        return
    done = [i for i, s in enumerate(searches) if s.done and i not in shown]
    shown.update(done)
    if done:
        bar.update(len(done))
