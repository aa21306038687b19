"""HF's beam-scorer rules in engine/beam_search.BeamSearch, stepped by hand with made-up top
logprobs (no model: milliseconds). The model-level equality with HF is test_beam_search.py."""

from __future__ import annotations

import math

import pytest
from pagedkv.engine.beam_search import BeamSearch, BeamSearchParams
from pagedkv.engine.outputs import Logprob

EOS = 9


def top(**entries: float) -> dict:
    """{token id: Logprob} from keywords t<id>=logprob."""
    return {int(k[1:]): Logprob(v) for k, v in entries.items()}


def test_eos_candidates_outside_the_best_beam_width_are_dropped() -> None:
    search = BeamSearch([100, 101], BeamSearchParams(2, 10), [EOS], 10)
    assert search.num_candidates == 4  # max(2, 1 + one EOS) x beam_width
    assert search.pending() == [[100, 101]]
    search.advance([top(t1=-0.1, t2=-0.5, t9=-1.0, t3=-2.0)])
    # EOS ranks 3rd of the step's candidates: not a hypothesis; the two best non-EOS run on.
    assert search.finished == []
    assert search.pending() == [[100, 101, 1], [100, 101, 2]]


def test_hypotheses_score_with_the_eos_counted_and_the_search_stops_on_hf_heuristic() -> None:
    search = BeamSearch([100], BeamSearchParams(2, 10), [EOS], 10)
    search.advance([top(t1=-0.1, t2=-0.5, t3=-2.0, t4=-3.0)])
    search.advance([top(t9=-0.05, t4=-0.3, t5=-4.0, t6=-5.0), top(t5=-0.2, t6=-0.4)])
    # [1, EOS] ranked first: finished with score (-0.1 - 0.05) / 2 tokens.
    assert [(round(s, 6), b.tokens) for s, b, _ in search.finished] == [(-0.075, [1, 9])]
    assert search.pending() == [[100, 1, 4], [100, 2, 5]]
    search.advance([top(t9=-0.1, t7=-0.2), top(t9=-0.1, t8=-3.0)])
    # [1, 4, EOS] (ranked first) finishes at -0.5 / 3; [2, 5, EOS] (3rd) is dropped. The best
    # running beam, [1, 4, 7] at -0.6 / 3 = -0.2, cannot beat the worst finished: done.
    assert search.done
    out = search.output(None)
    assert [s.tokens for s in out.sequences] == [[100, 1, 9], [100, 1, 4, 9]]
    assert [s.finish_reason for s in out.sequences] == ["stop", "stop"]
    assert [s.cum_logprob for s in out.sequences] == pytest.approx([-0.15, -0.5])


def test_max_tokens_finishes_the_best_beam_width_candidates() -> None:
    search = BeamSearch([100], BeamSearchParams(2, 2, length_penalty=0.0), [EOS], 2)
    search.advance([top(t1=-0.1, t2=-0.2, t3=-0.3, t4=-0.4)])
    search.advance([top(t5=-1.0, t6=-2.0), top(t7=-0.5, t9=-0.6)])
    assert search.done
    out = search.output(None)
    # Scores are the cumulative logprobs (length_penalty 0): [2, 7] -0.7, [2, EOS] -0.8.
    assert [s.generated_token_ids for s in out.sequences] == [[2, 7], [2, 9]]
    assert [s.finish_reason for s in out.sequences] == ["length", "stop"]


def test_text_leaves_the_eos_out_unless_asked() -> None:
    for keep, shown in ((False, [1]), (True, [1, 9])):
        search = BeamSearch([100], BeamSearchParams(1, 5, include_stop_str_in_output=keep), [9], 5)
        search.advance([top(t1=-0.1, t2=-0.2)])
        search.advance([top(t9=-0.1, t3=-0.2)])
        assert search.done
        (seq,) = search.output(lambda ids: ",".join(map(str, ids))).sequences
        assert seq.text == ",".join(map(str, shown)) and seq.tokens == [100, 1, 9]


def test_ignore_eos_makes_eos_an_ordinary_token() -> None:
    search = BeamSearch([100], BeamSearchParams(1, 3, ignore_eos=True), [EOS], 3)
    assert search.num_candidates == 2
    search.advance([top(t9=-0.1, t2=-0.2)])
    assert search.pending() == [[100, 9]] and not search.finished


@pytest.mark.parametrize("length_penalty", [1e308, -1e308, 2000.0, -2000.0])
def test_extreme_length_penalties_saturate_instead_of_raising(length_penalty: float) -> None:
    # 2 ** 1e308 overflowed (OverflowError) and 2 ** -1e308 divided by zero: a server 500.
    params = BeamSearchParams(2, 3, length_penalty=length_penalty)
    search = BeamSearch([100], params, [EOS], 10)
    search.advance([top(t1=-0.1, t2=-0.5, t9=-3.0, t4=-4.0)])
    search.advance([top(t9=-0.1, t3=-0.2, t5=-2.0, t6=-3.0), top(t9=-0.1, t7=-0.3, t8=-1.0)])
    assert search.finished and all(not math.isnan(score) for score, _, _ in search.finished)
