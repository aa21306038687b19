"""AsyncLLMEngine.shutdown() with requests still streaming or queued: their callers get
EngineDeadError naming the shutdown (before, they waited forever: nothing stepped the engine
any more), and a request after the shutdown is refused with the same error."""

from __future__ import annotations

import asyncio
from typing import Any, List

import pytest
from support.deps import need
from support.server import tiny_async_engine

need("torch")
need("transformers")

from pagedkv import SamplingParams  # noqa: E402
from pagedkv.engine.async_llm_engine import EngineDeadError  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_shutdown_ends_streaming_and_new_requests(tmp_path_factory: Any) -> None:
    engine = tiny_async_engine(tmp_path_factory, "audit5_shutdown", seed=3, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def consume(i: int, got: List[int]) -> None:
        async for out in engine.generate({"prompt_token_ids": [5, 6, i]}, params, f"r{i}"):
            got[i] = len(out.outputs[0].token_ids)

    async def main() -> None:
        got = [0, 0, 0]
        tasks = [asyncio.create_task(consume(i, got)) for i in range(3)]
        while min(got) == 0:  # every request streams
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
        done, pending = await asyncio.wait(tasks, timeout=5)
        for t in pending:
            t.cancel()
        assert not pending, "a stream still waits after shutdown"
        for t in done:
            with pytest.raises(EngineDeadError, match="the engine was shut down"):
                t.result()
        assert max(got) < 200  # (they were cut, not finished)
        with pytest.raises(EngineDeadError, match="the engine was shut down"):
            await asyncio.wait_for(consume(0, got), 5)

    try:
        asyncio.run(main())
        assert engine.is_dead and engine.dead_reason == "the engine was shut down"
    finally:
        engine.shutdown()
