"""Speculative verification applies each speculating request's sampling knobs to its k+1 target
rows in one batch; a request whose own knobs raise there fails alone (issue #25), as in the
plain sampler: the knobs are redone entry by entry, its request is aborted with its error, and
the others emit what they emit alone. n-gram speculation on a tiny random Llama (CPU)."""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.sampler import Sampler  # noqa: E402
from pagedkv.engine.spec_decode import draft_model, speculator  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
# Every token of the vocabulary is in each prompt: the 1-gram lookup drafts at every step.
PROMPTS = {
    "a": list(range(2, 64)),
    "bad": list(range(63, 1, -1)),
    "c": [*range(2, 64, 2), *range(3, 64, 2)],
}
MARK = 0.25  # frequency_penalty of the request whose knobs raise in verification


def _params(rid: str) -> SamplingParams:  # (a penalty keeps every row off the plain argmax)
    extra = {"frequency_penalty": MARK} if rid == "bad" else {}
    return SamplingParams(
        temperature=0, max_tokens=10, ignore_eos=True, repetition_penalty=1.05, **extra
    )


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = save_random_model(
        str(tmp_path_factory.mktemp("robust_spec")),
        "tiny-llama",
        seed=4,
        tokenizer=False,
        head_dim=32,
        vocab_size=64,
    )
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        skip_tokenizer_init=True,
        kv_cache_space=0.01,
        max_model_len=96,
        speculative_config=NGRAM,
    )


def test_knobs_raising_in_verification_fail_their_request_alone(llm: LLM, monkeypatch) -> None:
    eng = llm.llm_engine
    want = {}
    for rid, prompt in PROMPTS.items():
        out = llm.generate({"prompt_token_ids": prompt}, _params(rid), use_tqdm=False)[0]
        want[rid] = out.outputs[0].token_ids
    drafted = eng.core.speculator.metrics.num_drafts
    assert drafted >= 3 * 5  # the prompts gave n-gram drafts

    class Flaky(Sampler):
        @staticmethod
        def processed_logits(logits, rows):  # type: ignore[no-untyped-def]
            if any(r.params.frequency_penalty == MARK for r in rows):
                raise ValueError("knob bug")
            return Sampler.processed_logits(logits, rows)

    monkeypatch.setattr(speculator, "Sampler", Flaky)  # verification's knobs only
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, {"prompt_token_ids": prompt}, _params(rid))
    done = {}
    while eng.has_unfinished_requests():
        done.update((o.request_id, o) for o in eng.step() if o.finished)
    monkeypatch.undo()
    errors = eng.take_request_errors()
    assert list(errors) == ["bad"] and "knob bug" in repr(errors["bad"])
    assert done["bad"].outputs[0].finish_reason == "abort"
    for rid in ("a", "c"):
        assert done[rid].outputs[0].token_ids == want[rid], rid
    assert eng.core.speculator.metrics.num_drafts > drafted + 5  # they speculated again
    assert_no_leak(llm)


def test_knobs_raising_in_the_draft_model_fail_their_request_alone(tmp_path, monkeypatch):
    # The draft model draws its drafts under the same knobs: there a row whose knobs raise
    # drafts from the raw logits (a proposal only), and verification blames its request.
    path = save_random_model(
        str(tmp_path), "tiny-llama", seed=4, tokenizer=False, head_dim=32, vocab_size=64
    )
    llm = LLM(
        path,
        device="cpu",
        dtype="float32",
        skip_tokenizer_init=True,
        kv_cache_space=0.01,
        max_model_len=96,
        speculative_config={"model": path, "num_speculative_tokens": 3},
    )
    eng = llm.llm_engine
    want = {}
    for rid, prompt in PROMPTS.items():
        out = llm.generate({"prompt_token_ids": prompt}, _params(rid), use_tqdm=False)[0]
        want[rid] = out.outputs[0].token_ids
    draft_calls = []

    class Flaky(Sampler):
        @staticmethod
        def processed_logits(logits, rows):  # type: ignore[no-untyped-def]
            draft_calls.append(len(rows))
            if any(r.params.frequency_penalty == MARK for r in rows):
                raise ValueError("knob bug")
            return Sampler.processed_logits(logits, rows)

    monkeypatch.setattr(draft_model, "Sampler", Flaky)
    monkeypatch.setattr(speculator, "Sampler", Flaky)
    for rid, prompt in PROMPTS.items():
        eng.add_request(rid, {"prompt_token_ids": prompt}, _params(rid))
    done = {}
    while eng.has_unfinished_requests():
        done.update((o.request_id, o) for o in eng.step() if o.finished)
    monkeypatch.undo()
    assert 3 in draft_calls and 1 in draft_calls  # batched, then row by row
    errors = eng.take_request_errors()
    assert list(errors) == ["bad"] and "knob bug" in repr(errors["bad"])
    for rid in ("a", "c"):
        assert done[rid].outputs[0].token_ids == want[rid], rid
    assert_no_leak(llm)
