"""A step that fails because of one request fails that request alone (issue #25): its own
work (a user's logits processor, the sampler on its row, detokenization) raises, the engine
aborts it with its error, and the requests sharing its steps go on to the output they give
alone. Serial and overlapped loops, on a tiny random Llama (CPU, float32)."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.output_processor import OutputProcessor  # noqa: E402
from pagedkv.engine.request_failures import RequestFailedError  # noqa: E402
from pagedkv.engine.sampler import Sampler  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 256
MARK = 2  # logprobs of the request the patched sampler cannot take


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("tiny_blame")),
        "tiny-llama",
        seed=9,
        tokenizer=False,
        head_dim=32,  # wider heads than the preset's 16
        vocab_size=VOCAB,
        max_position_embeddings=256,
    )


def _llm(path: str, overlap: bool = False) -> LLM:
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        seed=0,
        skip_tokenizer_init=True,
        block_size=4,
        num_gpu_blocks_override=64,
        max_model_len=96,
        async_scheduling=overlap,
    )


def _prompts(n: int) -> list:
    rng = np.random.default_rng(3)
    return [rng.integers(3, VOCAB, int(rng.integers(4, 20))).tolist() for _ in range(n)]


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, **kw)


def _solo(llm: LLM, prompt: list, params: SamplingParams) -> list:
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    return out.outputs[0].token_ids


def _run(llm: LLM, requests: dict) -> dict:
    """Steps the engine over {request_id: (prompt, params)}: {id: final output}."""
    eng = llm.llm_engine
    for rid, (prompt, params) in requests.items():
        eng.add_request(rid, {"prompt_token_ids": prompt}, params)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    return done


def _raises_on_call(k: int):  # type: ignore[no-untyped-def]
    calls = [0]

    def processor(out: list, logits: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] == k:
            raise ValueError("processor bug")
        return logits

    return processor


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
def test_a_raising_logits_processor_fails_its_request_alone(model_dir: str, overlap: bool):
    llm = _llm(model_dir, overlap)
    prompts = _prompts(3)
    want = {str(i): _solo(llm, p, _greedy()) for i, p in enumerate(prompts)}
    bad = _greedy(logits_processors=[_raises_on_call(4)])
    done = _run(
        llm, {"0": (prompts[0], _greedy()), "bad": (prompts[1], bad), "2": (prompts[2], _greedy())}
    )
    errors = llm.llm_engine.take_request_errors()
    assert list(errors) == ["bad"] and "processor bug" in repr(errors["bad"])
    assert done["bad"].finished and done["bad"].outputs[0].finish_reason == "abort"
    assert len(done["bad"].outputs[0].token_ids) == 3  # the three steps before the error
    for rid in ("0", "2"):
        assert done[rid].outputs[0].token_ids == want[rid], rid
        assert done[rid].outputs[0].finish_reason == "length"
    assert_no_leak(llm)
    assert _solo(llm, prompts[1], _greedy()) == want["1"]  # the engine serves on


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
def test_a_sampler_failure_is_retried_row_by_row(model_dir: str, overlap: bool, monkeypatch):
    # The batched sampler raises whenever the marked request's row is in the batch (as top_k
    # = 2**64 did before it was refused); drawn row by row, only that row fails. logprobs keep
    # every request off the plain-argmax path, so all rows go through the sampler together.
    llm = _llm(model_dir, overlap)
    prompts = _prompts(3)
    good = _greedy(logprobs=1)
    want = {str(i): _solo(llm, p, good) for i, p in enumerate(prompts)}
    real = Sampler.__call__
    batches = []

    def flaky(self, logits, rows):  # type: ignore[no-untyped-def]
        batches.append(len(rows))
        if any(r.params.logprobs == MARK for r in rows):
            raise ValueError("Overflow when unpacking long long")
        return real(self, logits, rows)

    monkeypatch.setattr(Sampler, "__call__", flaky)
    done = _run(
        llm,
        {
            "0": (prompts[0], good),
            "bad": (prompts[1], _greedy(logprobs=MARK)),
            "2": (prompts[2], good),
        },
    )
    monkeypatch.undo()
    assert 3 in batches and 1 in batches  # the batch, then the retry row by row
    errors = llm.llm_engine.take_request_errors()
    assert list(errors) == ["bad"] and "Overflow" in repr(errors["bad"])
    assert done["bad"].outputs[0].finish_reason == "abort" and not done["bad"].outputs[0].token_ids
    for rid in ("0", "2"):
        assert done[rid].outputs[0].token_ids == want[rid], rid
    assert_no_leak(llm)


def test_a_failing_detokenization_fails_its_request_alone(model_dir: str, monkeypatch):
    llm = _llm(model_dir)
    prompts = _prompts(2)
    want = _solo(llm, prompts[0], _greedy())
    real = OutputProcessor._accept_token

    def flaky(self, req, *args, **kwargs):  # type: ignore[no-untyped-def]
        if req.request_id == "bad" and len(req.seqs[0].token_ids) == 5:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return real(self, req, *args, **kwargs)

    monkeypatch.setattr(OutputProcessor, "_accept_token", flaky)
    # (logprobs: a token with something to record goes through _accept_token; a plain running
    # token of a request without text is handled inline)
    done = _run(llm, {"ok": (prompts[0], _greedy()), "bad": (prompts[1], _greedy(logprobs=1))})
    monkeypatch.undo()
    assert isinstance(llm.llm_engine.take_request_errors()["bad"], UnicodeDecodeError)
    assert done["bad"].outputs[0].finish_reason == "abort"
    assert done["ok"].outputs[0].token_ids == want
    assert_no_leak(llm)


def test_generate_raises_the_failed_requests_error_by_name(model_dir: str):
    llm = _llm(model_dir)
    prompts = _prompts(2)
    params = [_greedy(), _greedy(logits_processors=[_raises_on_call(2)])]
    with pytest.raises(RequestFailedError, match="request '1' failed: ValueError"):
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert not llm.llm_engine.take_request_errors()
    assert_no_leak(llm)
    assert len(_solo(llm, prompts[1], _greedy())) == 12


def test_a_failing_prompt_logprobs_request_fails_alone(model_dir: str, monkeypatch):
    llm = _llm(model_dir)
    prompts = _prompts(2)
    good = _greedy(prompt_logprobs=1)
    want = llm.generate({"prompt_token_ids": prompts[0]}, good, use_tqdm=False)[0]
    real = Sampler.prompt_logprobs

    def flaky(self, logits, nxt, k):  # type: ignore[no-untyped-def]
        if k == 3:  # only the batch holding the marked request asks for 3
            raise ValueError("prompt logprobs bug")
        return real(logits, nxt, k)  # (a staticmethod)

    monkeypatch.setattr(Sampler, "prompt_logprobs", flaky)
    done = _run(llm, {"ok": (prompts[0], good), "bad": (prompts[1], _greedy(prompt_logprobs=3))})
    monkeypatch.undo()
    assert "prompt logprobs bug" in repr(llm.llm_engine.take_request_errors()["bad"])
    assert done["bad"].outputs[0].finish_reason == "abort"
    got = done["ok"]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    assert [None if d is None else sorted(d) for d in got.prompt_logprobs] == [
        None if d is None else sorted(d) for d in want.prompt_logprobs
    ]
    assert_no_leak(llm)
