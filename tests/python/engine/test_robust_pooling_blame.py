"""A pooling head that raises for one request fails that request alone (issue #25): the step's
batched heads are retried request by request, the request whose own head raises is reported
by take_request_errors (LLM.embed raises RequestFailedError naming it; the server answers it
with an error), and the other requests finished in the same step get their embeddings."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from support.deps import need

need("transformers")

from pagedkv import LLM  # noqa: E402
from pagedkv.engine.pooler import Pooler  # noqa: E402
from pagedkv.engine.pooling_params import PoolingParams  # noqa: E402
from pagedkv.engine.request_failures import RequestFailedError  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

TEXTS = ["hello world", "paged attention", "a b c d"]


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    path = save_random_model(
        str(tmp_path_factory.mktemp("robust_pool")), "tiny-llama", seed=3, head_dim=32
    )
    return LLM(path, device="cpu", task="embed", kv_cache_space=0.01, max_model_len=64)


def _flaky(monkeypatch) -> list:
    """Pooler.pool raises whenever a request with normalize=False is in its batch."""
    real, batches = Pooler.pool, []

    def pool(self, tasks, rows, token_ids, params):  # type: ignore[no-untyped-def]
        batches.append(len(tasks))
        if any(p.normalize is False for p in params):
            raise ValueError("pooling head bug")
        return real(self, tasks, rows, token_ids, params)

    monkeypatch.setattr(Pooler, "pool", pool)
    return batches


def test_a_raising_head_fails_its_request_alone(llm: LLM, monkeypatch) -> None:
    want = [o.outputs.data for o in llm.encode(TEXTS, pooling_task="embed", use_tqdm=False)]
    batches = _flaky(monkeypatch)
    eng = llm.llm_engine
    good = PoolingParams(task="embed")
    for i, text in enumerate(TEXTS):
        params = PoolingParams(task="embed", normalize=False) if i == 1 else good
        eng.add_request(str(i), text, params)
    done = {}
    while eng.has_unfinished_requests():
        done.update((o.request_id, o) for o in eng.step())
    assert 3 in batches and 1 in batches  # the batch, then request by request
    errors = eng.take_request_errors()
    assert list(errors) == ["1"] and "pooling head bug" in repr(errors["1"])
    assert done["1"].finished and done["1"].outputs.data.numel() == 0
    for i in (0, 2):
        torch.testing.assert_close(done[str(i)].outputs.data, want[i])
    assert not eng.take_request_errors()  # taken once


def test_embed_raises_the_failed_requests_error_by_name(llm: LLM, monkeypatch) -> None:
    _flaky(monkeypatch)
    params = [PoolingParams(), PoolingParams(normalize=False)]
    with pytest.raises(RequestFailedError, match="request '.*' failed: ValueError"):
        llm.embed(TEXTS[:2], pooling_params=params, use_tqdm=False)
    monkeypatch.undo()
    assert not llm.llm_engine.has_unfinished_requests()
    assert len(llm.embed(TEXTS[0], use_tqdm=False)[0].outputs.embedding) > 0


def test_async_engine_answers_the_failed_request_alone(llm: LLM, monkeypatch) -> None:
    # What the server runs: the failed request's stream raises StepFailedError, the others get
    # their embeddings, and the engine loop lives on.
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine, StepFailedError

    _flaky(monkeypatch)
    eng = AsyncLLMEngine(llm.llm_engine)

    async def one(rid: str, params: PoolingParams) -> Any:
        try:
            async for out in await eng.add_request(rid, TEXTS[int(rid)], params):
                last = out
            return last
        except StepFailedError as exc:
            return exc

    async def run() -> list:
        bad = PoolingParams(task="embed", normalize=False)
        good = PoolingParams(task="embed")
        return await asyncio.gather(*(one(str(i), bad if i == 1 else good) for i in range(3)))

    try:
        got = asyncio.run(asyncio.wait_for(run(), 30))
        assert isinstance(got[1], StepFailedError) and "pooling head bug" in str(got[1])
        assert got[0].outputs.data.numel() > 0 and got[2].outputs.data.numel() > 0
        assert not eng.is_dead
    finally:
        eng.shutdown()
