"""A request whose add is still queued when an engine step fails was not in that step: it
must run to its end. Before, AsyncLLMEngine failed every registered stream the engine did not
hold, including those whose add command had not run yet (they got StepFailedError, a 500)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from support.deps import need
from support.server import tiny_async_engine, wait_engine_idle

need("torch")
need("transformers")

from pagedkv import SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_request_queued_during_a_failed_step_is_served(tmp_path_factory: Any) -> None:
    engine = tiny_async_engine(tmp_path_factory, "audit5_add_fail", seed=4, max_model_len=128)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    real_step = engine.engine.step
    state: dict = {}

    def failing_step() -> Any:
        """The first step: request "b" is registered (its add queued behind this step), then
        the step raises without aborting anything."""
        if "b" in state:
            return real_step()
        state["b"] = asyncio.run_coroutine_threadsafe(
            engine.add_request("b", {"prompt_token_ids": [4, 5, 6]}, params), state["loop"]
        )
        deadline = time.monotonic() + 5
        while engine.num_active_requests() < 2:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        raise RuntimeError("injected step failure")

    engine.engine.step = failing_step

    async def main() -> int:
        state["loop"] = asyncio.get_running_loop()
        final = None
        async for out in engine.generate({"prompt_token_ids": [1, 2, 3]}, params, "a"):
            final = out
        assert final is not None and final.finished
        stream = await asyncio.wrap_future(state["b"])
        last = None
        async for out in stream:
            last = out
        assert last is not None and last.finished
        return len(last.outputs[0].token_ids)

    try:
        assert asyncio.run(main()) == 6
        wait_engine_idle(engine)
        assert not engine.is_dead
    finally:
        engine.shutdown()
