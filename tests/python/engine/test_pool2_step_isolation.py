"""A pooling step isolates its requests (issue #25): when one request's input breaks the batched
forward, or its rows cannot be gathered, that request fails alone (take_request_errors names
it, its output is finished with no data) and every other request of the step gets what a solo
run gives it; no KV block is leaked. Decoder (LAST pooling) and BERT cross-encoder (token
types, non-causal) engines."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest
import torch
from support.deps import need
from support.engine import assert_no_leak

need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine import pooling_engine  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.engine.request_failures import RequestFailedError  # noqa: E402
from pagedkv.testing import save_random_encoder, save_random_model  # noqa: E402

POISON = 7  # a token id the injected model bug cannot take


def _poison_forward(llm: LLM, monkeypatch: Any) -> List[int]:
    """The runner raises on any plan holding POISON; returns the sequence counts it saw."""
    runner = llm.llm_engine.runner
    real, seen = runner.execute, []

    def execute(plan: Any, **kw: Any) -> torch.Tensor:
        n = int(plan.num_seqs)
        seen.append(n)
        if POISON in list(plan.input_ids[: int(plan.num_tokens)]):
            raise ValueError("model cannot take this input")
        return real(plan, **kw)

    monkeypatch.setattr(runner, "execute", execute)
    return seen


def _step_all(eng: Any, prompts: Dict[str, Any]) -> Dict[str, Any]:
    for rid, prompt in prompts.items():
        eng.add_request(rid, prompt, PoolingParams(task=eng.task))
    done: Dict[str, Any] = {}
    while eng.has_unfinished_requests():
        done.update((o.request_id, o) for o in eng.step())
    return done


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> LLM:
    path = save_random_model(
        str(tmp_path_factory.mktemp("pool2_dec")), "tiny-llama", seed=4, head_dim=32
    )
    return LLM(path, device="cpu", task="embed", kv_cache_space=0.01, max_model_len=64)


GOOD = {"a": [3, 4, 5, 6], "b": [10, 11, 12, 13, 14, 15], "c": [20, 21]}


def test_forward_failure_fails_its_request_alone(decoder: LLM, monkeypatch) -> None:
    eng = decoder.llm_engine
    solo = {rid: _step_all(eng, {rid: {"prompt_token_ids": ids}})[rid] for rid, ids in GOOD.items()}
    seen = _poison_forward(decoder, monkeypatch)
    prompts = {k: {"prompt_token_ids": v} for k, v in GOOD.items()}
    prompts["bad"] = {"prompt_token_ids": [9, POISON, 9]}
    done = _step_all(eng, prompts)
    assert seen[0] == 4 and seen[1:5] == [1, 1, 1, 1]  # the batch, then each alone
    errors = eng.take_request_errors()
    assert list(errors) == ["bad"] and "cannot take this input" in repr(errors["bad"])
    assert done["bad"].finished and done["bad"].outputs.data.numel() == 0
    for rid in GOOD:
        torch.testing.assert_close(done[rid].outputs.data, solo[rid].outputs.data)
    assert_no_leak(decoder)
    # The next step batches again.
    again = _step_all(eng, {k: {"prompt_token_ids": v} for k, v in GOOD.items()})
    assert seen[5] == 3 and len(seen) == 6
    torch.testing.assert_close(again["b"].outputs.data, solo["b"].outputs.data)


def test_embed_names_the_request_whose_forward_failed(decoder: LLM, monkeypatch) -> None:
    _poison_forward(decoder, monkeypatch)
    with pytest.raises(RequestFailedError, match="request '.*' failed: ValueError"):
        decoder.embed(
            [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [POISON]}], use_tqdm=False
        )
    assert_no_leak(decoder)


def test_a_gather_failure_fails_its_request_alone(decoder: LLM, monkeypatch) -> None:
    eng = decoder.llm_engine
    solo = _step_all(eng, {"a": {"prompt_token_ids": GOOD["a"]}})["a"]
    real = pooling_engine._Running.gather

    def gather(self: Any, start: int, hidden: torch.Tensor, completes: bool) -> None:
        if self.req.request_id == "bad":
            raise RuntimeError("rows lost")
        real(self, start, hidden, completes)

    monkeypatch.setattr(pooling_engine._Running, "gather", gather)
    done = _step_all(
        eng, {"bad": {"prompt_token_ids": [1, 2, 3]}, "a": {"prompt_token_ids": GOOD["a"]}}
    )
    assert list(eng.take_request_errors()) == ["bad"]
    assert done["bad"].outputs.data.numel() == 0
    torch.testing.assert_close(done["a"].outputs.data, solo.outputs.data)
    assert_no_leak(decoder)


def test_cross_encoder_pairs_isolated_with_token_types(tmp_path, monkeypatch) -> None:
    # A BERT cross-encoder: each pair carries token types, sliced to each solo rerun.
    path = save_random_encoder(str(tmp_path / "bert"), "bert", num_labels=1, seed=6)
    llm = LLM(path, device="cpu", task="score", kv_cache_space=0.02, max_model_len=64)
    tok = llm.llm_engine.tokenizer
    from pagedkv.engine.llm_pooling import pair_prompt

    pairs = {
        "p0": pair_prompt(tok, "what is a panda", "a bear"),
        "p1": pair_prompt(tok, "paged attention", "blocks of keys and values"),
    }
    assert all("token_type_ids" in p for p in pairs.values())
    solo = {rid: _step_all(llm.llm_engine, {rid: p})[rid] for rid, p in pairs.items()}
    seen = _poison_forward(llm, monkeypatch)
    bad_ids = list(pairs["p0"]["prompt_token_ids"])
    bad_ids[1] = POISON
    bad = dict(pairs["p0"], prompt_token_ids=bad_ids)
    done = _step_all(llm.llm_engine, {**pairs, "bad": bad})
    assert seen[:4] == [3, 1, 1, 1]
    assert list(llm.llm_engine.take_request_errors()) == ["bad"]
    for rid in pairs:
        torch.testing.assert_close(done[rid].outputs.data, solo[rid].outputs.data)
    assert_no_leak(llm)


def test_async_engine_fails_the_poisoned_request_alone(decoder: LLM, monkeypatch) -> None:
    # What the server runs: the failed request's stream ends with StepFailedError (it gets a
    # finished output, so its stream does not hang), the others get their embeddings.
    import asyncio

    from pagedkv.engine.async_llm_engine import AsyncLLMEngine, StepFailedError

    eng = decoder.llm_engine
    solo = _step_all(eng, {"a": {"prompt_token_ids": GOOD["a"]}})["a"]
    _poison_forward(decoder, monkeypatch)
    engine = AsyncLLMEngine(eng)

    async def one(rid: str, ids: List[int]) -> Any:
        try:
            params = PoolingParams(task="embed")
            async for out in await engine.add_request(rid, {"prompt_token_ids": ids}, params):
                last = out
            return last
        except StepFailedError as exc:
            return exc

    async def run() -> list:
        return await asyncio.gather(one("a", GOOD["a"]), one("bad", [POISON, 1]))

    try:
        good, bad = asyncio.run(asyncio.wait_for(run(), 30))
        assert isinstance(bad, StepFailedError) and "cannot take this input" in str(bad)
        torch.testing.assert_close(good.outputs.data, solo.outputs.data)
        assert not engine.is_dead
    finally:
        engine.shutdown()


def test_a_plan_with_block_operations_is_not_redone(decoder: LLM, monkeypatch) -> None:
    # Whether a failed batch ran its swaps / copies is unknown: a rerun without them could read
    # stale blocks, so such a step fails whole (as before) instead of being redone.
    import numpy as np

    eng = decoder.llm_engine
    seen = _poison_forward(decoder, monkeypatch)
    eng.add_request("x", {"prompt_token_ids": [POISON, 1]}, PoolingParams(task="embed"))
    eng.add_request("y", {"prompt_token_ids": [2, 3]}, PoolingParams(task="embed"))
    plan = eng.scheduler.schedule()
    ids = list(plan.request_ids)[: int(plan.num_seqs)]

    class WithCopies:
        blocks_to_copy = np.zeros((1, 2), dtype=np.int64)

        def __getattr__(self, name: str) -> Any:
            return getattr(plan, name)

    with pytest.raises(ValueError, match="cannot take this input"):
        eng._forward(WithCopies(), ids)
    assert seen == [2]
    eng._fail(plan, ids)
    assert_no_leak(decoder)
