"""RequestState's min_tokens bans, stop-string truncation, streamed hold-back and
best_of selection, on hand-built states (no model: these run in milliseconds).

Until now they were only reached through end-to-end generation with the default model, which
takes minutes per run and exercises each rule at one point at most. Expected values here follow
vLLM's documented semantics (the finishing rule itself is the scheduler's, tested in
tests/python/core/test_scheduler_finish.py): a stop string is cut from the text unless
include_stop_str_in_output, streamed text never shows a possible stop-string prefix, best_of
keeps the n samples with the highest cumulative logprob.
"""

from __future__ import annotations

from support.deps import need

need("torch")

from pagedkv.engine.outputs import RequestMetrics  # noqa: E402
from pagedkv.engine.request_state import RequestState, SeqState  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

EOS = 2


def _state(n_seqs: int = 1, max_tokens: int = 10, **kw) -> RequestState:
    params = SamplingParams(max_tokens=max_tokens, **kw)
    req = RequestState("r", "prompt", [5, 6, 7], params, RequestMetrics(0.0), max_tokens, [EOS])
    req.seqs = [SeqState(index=i) for i in range(n_seqs)]
    return req


def test_banned_tokens_until_min_tokens() -> None:
    req = _state(min_tokens=2, stop_token_ids=[9])
    seq = req.seqs[0]
    assert sorted(req.banned_tokens(seq)) == [EOS, 9]
    seq.token_ids = [4]
    assert sorted(req.banned_tokens(seq)) == [EOS, 9]
    seq.token_ids = [4, 4]
    assert req.banned_tokens(seq) == []
    ign = _state(min_tokens=3, ignore_eos=True, stop_token_ids=[9])
    assert ign.banned_tokens(ign.seqs[0]) == [9]  # EOS is never a stop here, so not banned


def test_stop_strings_truncate_and_wait_for_min_tokens() -> None:
    req = _state(stop=["END", "halt"], min_tokens=2)
    seq = req.seqs[0]
    seq.token_ids, seq.text = [4], "say END"
    assert not req.check_stop_strings(seq, 7)  # one token < min_tokens: not yet
    assert seq.text == "say END" and seq.finish_reason is None
    seq.token_ids, seq.text = [4, 4], "say END now halt"
    assert req.check_stop_strings(seq, 16)
    assert (seq.text, seq.finish_reason, seq.stop_reason) == ("say ", "stop", "END")
    keep = _state(stop=["END"], include_stop_str_in_output=True)
    seq = keep.seqs[0]
    seq.token_ids, seq.text = [4], "say END now"
    assert keep.check_stop_strings(seq, 11)
    assert seq.text == "say END"


def test_streamed_text_holds_back_a_possible_stop_string_prefix() -> None:
    req = _state(stop=["STOP"])
    seq = req.seqs[0]
    seq.token_ids, seq.text = [4], "abc ST"
    assert req.to_output().outputs[0].text == "abc "  # "ST" may become "STOP"
    seq.token_ids, seq.text = [4, 4], "abc STx"
    assert req.to_output().outputs[0].text == "abc STx"
    seq.token_ids, seq.text, seq.finish_reason = [4, 4, 4], "abc S", "length"
    assert req.to_output().outputs[0].text == "abc S"  # finished: nothing is held back
    inc = _state(stop=["STOP"], include_stop_str_in_output=True)
    inc.seqs[0].token_ids, inc.seqs[0].text = [4], "abc ST"
    assert inc.to_output().outputs[0].text == "abc ST"


def test_best_of_keeps_the_highest_cumulative_logprobs() -> None:
    req = _state(n_seqs=4, n=2, best_of=4, temperature=1.0)
    for s, lp in zip(req.seqs, (-3.0, -0.5, -7.0, -1.0)):
        s.token_ids, s.text, s.cumulative_logprob = [4], f"t{s.index}", lp
        s.finish_reason = "length"
    out = req.to_output()
    assert out.finished
    assert [c.text for c in out.outputs] == ["t1", "t3"]
    assert [c.index for c in out.outputs] == [0, 1]
    assert [c.cumulative_logprob for c in out.outputs] == [-0.5, -1.0]
