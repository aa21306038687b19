"""OutputProcessor: a step's results in, RequestOutputs out (vLLM v1's output processor).

Takes the engine core's StepResult (tokens appended, finishes decided by the scheduler) and
does what needs text: incremental detokenization, stop strings (which finish a sample the
scheduler does not know is done: the caller then stops it in the core), the token texts of
logprobs, request metrics, and the RequestOutputs of the requests with something to show. It
holds the live requests by id and forgets each once its final output is built. Each request's
work runs under a guard naming it: an error there fails that request alone (the caller aborts
it), the other requests' outputs are built as usual.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from pagedkv.engine.detokenizer import IncrementalDetokenizer
from pagedkv.engine.direct_decoder import DirectDecoder
from pagedkv.engine.engine_core import SeqUpdate, StepResult
from pagedkv.engine.outputs import Logprob, RequestOutput
from pagedkv.engine.request_failures import RequestFailures
from pagedkv.engine.request_state import RequestState, SeqState
from pagedkv.engine.step_sampling import TokenLogprob

Stopped = Tuple[RequestState, SeqState]


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.decoder = DirectDecoder(tokenizer) if tokenizer is not None else None
        self._token_text: Dict[int, str] = {}  # token id -> its text alone (logprob entries)
        self.requests: Dict[str, RequestState] = {}
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}

    def add_request(self, req: RequestState) -> None:
        self.requests[req.request_id] = req

    def drop(self, reqs: Iterable[RequestState]) -> List[str]:
        """Forgets requests the engine aborted; returns the ids it still held."""
        return [r.request_id for r in reqs if self.requests.pop(r.request_id, None) is not None]

    def process(self, result: StepResult) -> Tuple[List[RequestOutput], List[Stopped]]:
        """(the outputs of this step, the samples a stop string finished: the caller stops
        them in the core). Requests whose work raised are added to result.failures, and have
        no output here."""
        for d in result.prompt_logprobs:
            self.decode_logprob_tokens(d)
        failures = result.failures
        # Only requests with something to report: streaming ones, and those whose sample
        # finished (generate()'s final_only requests report once, at the end).
        touched: Dict[str, RequestState] = {}
        stopped: List[Stopped] = []
        cut: Set[int] = set()  # samples a stop string ended inside this step's tokens
        num_tokens = 0

        now = result.now

        def accept(u: SeqUpdate) -> None:
            nonlocal num_tokens
            req, seq, tok, lp, sched_finished = u
            if cut and id(seq) in cut:
                # A speculative step appended several tokens; those after the stop string
                # are not output (they are the sample's last ones).
                seq.token_ids.pop()
                return
            num_tokens += 1
            metrics = req.metrics
            if (
                lp is None
                and seq.finish_reason is None
                and not req.incremental_text
                and metrics.first_token_time is not None
            ):
                # The common running token (_accept_token's first case, inline: no call per
                # token per step): nothing to show, check or decode yet.
                metrics.last_token_time = now
            elif self._accept_token(req, seq, tok, lp, sched_finished, now):
                stopped.append((req, seq))
                cut.add(id(seq))
            if not req.final_only or seq.finish_reason is not None:
                touched[req.request_id] = req

        failures.each(result.updates, _request_of, accept)
        self.stats["generation_tokens"] += num_tokens
        outputs = self._collect_outputs(touched, failures)
        return outputs, [(r, s) for r, s in stopped if r not in failures]

    def _accept_token(
        self,
        req: RequestState,
        seq: SeqState,
        tok: int,
        lp: Optional[TokenLogprob],
        sched_finished: bool,
        now: float,
    ) -> bool:
        """Metrics, logprob texts, text and stop strings for a token the core appended.
        True when a stop string finished a sample the scheduler still runs."""
        metrics = req.metrics
        if metrics.first_token_time is None:
            metrics.first_token_time = now
            self.stats["prompt_tokens"] += len(req.prompt_token_ids)
        metrics.last_token_time = now
        if lp is not None and seq.logprobs is not None and lp[1] is not None:
            self.decode_logprob_tokens(lp[1])
        if seq.finish_reason is None and not req.incremental_text:
            return False  # the common running case: nothing to show or check yet
        # A stop token / EOS ends the text without being shown (vLLM's rule).
        hide = (
            sched_finished
            and seq.finish_reason == "stop"
            and not req.params.include_stop_str_in_output
        )
        if not req.incremental_text:
            if seq.finished and req.params.detokenize and self.decoder is not None:
                shown = seq.token_ids[:-1] if hide else seq.token_ids
                p = req.params
                seq.text = self.decoder.decode(
                    shown, p.skip_special_tokens, p.spaces_between_special_tokens
                )
            return False
        was_finished = seq.finished
        delta = self._detokenize(req, seq, [] if hide else [tok])
        if req.check_stop_strings(seq, delta):
            return not was_finished
        if seq.finished:
            seq.text += seq.detok.flush()  # release a held-back partial character
        return False

    def _detokenize(self, req: RequestState, seq: SeqState, toks: List[int]) -> int:
        """Appends the tokens' text to the sample; returns how many characters it added."""
        if seq.detok is None:
            p = req.params
            seq.detok = IncrementalDetokenizer(
                self.decoder, p.skip_special_tokens, p.spaces_between_special_tokens
            )
        delta = seq.detok.append(toks)
        seq.text += delta
        return len(delta)

    def decode_logprob_tokens(self, d: Dict[int, Logprob]) -> Dict[int, Logprob]:
        if self.decoder is None:
            return d
        cache = self._token_text
        for tid, lp in d.items():
            text = cache.get(tid)
            if text is None:  # one decode per vocabulary entry, not per entry per step
                text = cache[tid] = self.decoder.decode([tid], skip_special_tokens=False)
            lp.decoded_token = text
        return d

    def _collect_outputs(
        self, touched: Dict[str, RequestState], failures: RequestFailures
    ) -> List[RequestOutput]:
        outs: List[RequestOutput] = []

        def collect(req: RequestState) -> None:
            best_of = req.params.best_of or req.params.n  # set by SamplingParams.__post_init__
            if not req.finished and (req.final_only or best_of > req.params.n):
                return  # best_of picks the winners at the end only
            outs.append(req.to_output())

        live = [req for req in touched.values() if req not in failures]
        failures.each(live, _same, collect)
        for req in live:  # (one whose output failed just now is finished all the same)
            if req.finished:
                self.requests.pop(req.request_id, None)
        return outs


# (a C-level getter: called once per token per step)
_request_of: Callable[[SeqUpdate], RequestState] = operator.itemgetter(0)


def _same(req: RequestState) -> RequestState:
    return req
