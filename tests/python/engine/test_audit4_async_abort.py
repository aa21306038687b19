"""AsyncLLMEngine.abort(request_id) while a reader iterates the request's stream: the stream
ends with the request's final output (finish_reason "abort", the tokens it had), as in vLLM,
instead of leaving the reader waiting forever; the KV blocks come back. With and without a
draft model (a speculating request holds the draft's blocks too)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support.deps import need
from support.server import wait_engine_idle

need("torch")

from pagedkv import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MAX_TOKENS = 200


async def _abort_after_first_output(eng: Any) -> Any:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    last = None
    async for out in eng.generate("hello", params, "victim"):
        if last is None:
            eng.abort("victim")
        last = out
    return last


@pytest.fixture(scope="module")
def model(tmp_path_factory: Any) -> str:
    from pagedkv.testing import save_random_model

    path = str(tmp_path_factory.mktemp("abort_model"))
    return save_random_model(path, "tiny-llama", seed=3, head_dim=32, max_position_embeddings=256)


def _engine(model: str, **kw: Any) -> Any:
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine

    return AsyncLLMEngine(
        model=model,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=256,
        **kw,
    )


@pytest.mark.parametrize("draft", [False, True])
def test_abort_ends_the_stream_with_an_abort_output(model: str, draft: bool) -> None:
    # The checkpoint as its own draft: every draft accepted, k + 1 tokens a step.
    spec = {"model": model, "num_speculative_tokens": 3} if draft else None
    eng = _engine(model, speculative_config=spec)
    try:
        last = asyncio.run(asyncio.wait_for(_abort_after_first_output(eng), 30))
        assert last.finished
        got = last.outputs[0]
        assert got.finish_reason == "abort"
        assert 0 < len(got.token_ids) < MAX_TOKENS
        wait_engine_idle(eng)
        eng.abort("victim")  # finished and gone: nothing to do, nothing raised
    finally:
        eng.shutdown()


def test_abort_whose_final_output_raises_ends_only_that_stream(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The aborted request's final output is built on the engine thread: one that raises (a
    detokeniser failing on its tokens) ends its own stream with RequestAbortedError; the
    engine keeps serving."""
    from pagedkv.engine.async_llm_engine import RequestAbortedError
    from pagedkv.engine.request_state import RequestState

    real = RequestState.to_output

    def broken(self: RequestState) -> Any:  # only an aborted request's final output fails
        if any(s.finish_reason == "abort" for s in self.seqs):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "planted")
        return real(self)

    monkeypatch.setattr(RequestState, "to_output", broken)
    eng = _engine(model)
    # Steps of at least 10 ms: the victim cannot finish its 200 tokens before the reader's
    # abort lands, even on a loaded machine.
    real_step = eng.engine.step

    def slow_step() -> Any:
        time.sleep(0.01)
        return real_step()

    eng.engine.step = slow_step  # type: ignore[method-assign]

    async def victim() -> None:
        params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
        async for _ in eng.generate("hello", params, "victim"):
            eng.abort("victim")

    async def after() -> Any:
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        last = None
        async for out in eng.generate("again", params, "after"):
            last = out
        return last

    try:
        with pytest.raises(RequestAbortedError):
            asyncio.run(asyncio.wait_for(victim(), 30))
        last = asyncio.run(asyncio.wait_for(after(), 30))
        assert last.finished and len(last.outputs[0].token_ids) == 5
        assert not eng.is_dead
    finally:
        eng.shutdown()
