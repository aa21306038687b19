"""AsyncLLMEngine over the real LLMEngine (default model): streaming, abort on early exit or
cancellation (blocks freed), bad requests, a failed step failing only its requests, and a dying
engine loop (steps failing again and again) failing requests and /health instead of hanging.
The death test runs last: it kills the module's engine."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.deps import need

need("torch")  # the engine runs its model in torch

from pagedkv.engine.async_llm_engine import (  # noqa: E402
    AsyncLLMEngine,
    EngineDeadError,
    StepFailedError,
)
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def engine():
    eng = AsyncLLMEngine(max_model_len=256, kv_cache_space=0.1, max_num_seqs=16)
    yield eng
    eng.shutdown()


def wait_idle(engine: AsyncLLMEngine, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        stats = engine.get_stats()
        idle = stats["num_requests_running"] == 0 and stats["kv_cache_usage_perc"] == 0
        if idle and not engine.engine.has_unfinished_requests():
            return stats
        assert time.monotonic() < deadline, f"engine not idle: {stats}"
        time.sleep(0.05)


def test_generate_streams_cumulative_outputs(engine: AsyncLLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    async def run() -> list:
        return [out async for out in engine.generate(PROMPT, params, "gen-1")]

    outs = asyncio.run(run())
    assert outs[-1].finished and not any(o.finished for o in outs[:-1])
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    assert lengths == sorted(lengths) and lengths[-1] == 8
    texts = [o.outputs[0].text for o in outs]
    assert all(texts[-1].startswith(t) for t in texts)
    assert outs[-1].outputs[0].finish_reason == "length"
    # The same request again (ids this time) is deterministic.
    ids = engine.tokenizer.encode(PROMPT)

    async def again() -> str:
        outs = [out async for out in engine.generate(ids, params, "gen-2")]
        return outs[-1].outputs[0].text

    assert asyncio.run(again()) == texts[-1]
    wait_idle(engine)


def test_early_exit_and_cancel_abort(engine: AsyncLLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def leave_early() -> int:
        gen = engine.generate(PROMPT, params, "early")
        n = 0
        async for _ in gen:
            n += 1
            if n == 2:
                break
        await gen.aclose()
        return n

    async def cancel_task() -> None:
        async def consume() -> None:
            async for _ in engine.generate(PROMPT, params, "cancelled"):
                pass

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert asyncio.run(leave_early()) == 2
    asyncio.run(cancel_task())
    stats = wait_idle(engine)
    assert stats["generation_tokens"] < 2 * 200  # neither ran to the end
    assert engine.num_active_requests() == 0


def test_bad_requests_raise_value_error(engine: AsyncLLMEngine) -> None:
    async def run(prompt, params, rid):
        async for _ in engine.generate(prompt, params, rid):
            pass

    with pytest.raises(ValueError, match="prompt_token_ids must be in"):
        asyncio.run(run([10**9], SamplingParams(max_tokens=2), "bad-ids"))
    with pytest.raises(ValueError, match="does not leave room"):
        asyncio.run(run("word " * 400, SamplingParams(max_tokens=2), "too-long"))
    assert not engine.is_dead
    asyncio.run(run(PROMPT, SamplingParams(max_tokens=2), "after-bad"))
    wait_idle(engine)


def _engine_outputs(n: int, steps: int):
    """Cumulative outputs of one n-sample request the way an engine that mutates its output in
    place would hand them out (the worst case for the snapshot): one RequestOutput object whose
    samples grow, a sample i finishing at step 2 + i."""
    from pagedkv.engine.outputs import CompletionOutput, Logprob, RequestOutput

    outs = [CompletionOutput(i, "", [], 0.0, []) for i in range(n)]
    out = RequestOutput("r", "p", [1, 2], None, outs, False)
    for t in range(1, steps + 1):
        changed = 0
        for c in outs:
            if c.finish_reason is None:
                c.token_ids.append(t)
                c.text += f" {t}"
                c.logprobs.append({t: Logprob(-0.5)})
                c.cumulative_logprob -= 0.5
                changed += 1
                if t >= 2 + c.index:
                    c.finish_reason, c.stop_reason = "stop", t
        out.finished = t == steps
        yield out, changed


def test_snapshot_copies_only_the_samples_that_changed() -> None:
    import copy

    from pagedkv.engine.async_llm_engine import _snapshot

    n, steps = 6, 10
    prev, seen = None, []
    for out, changed in _engine_outputs(n, steps):
        snap = _snapshot(out, prev)
        assert snap == copy.deepcopy(out)  # what the engine holds at this step, exactly
        seen.append((snap, copy.deepcopy(snap)))
        if prev is not None:  # a sample that did not advance is the previous snapshot's copy
            fresh = sum(c is not p for c, p in zip(snap.outputs, prev.outputs))
            assert fresh == changed, (fresh, changed)
        prev = snap
    # No later step changed an output already handed to the reader.
    assert all(s == kept for s, kept in seen)


def test_engine_outputs_rebuild_only_the_samples_that_changed() -> None:
    import copy

    from pagedkv.engine.outputs import RequestMetrics
    from pagedkv.engine.request_state import RequestState, SeqState

    n, steps = 5, 8
    req = RequestState(
        "r", "p", [1, 2], SamplingParams(n=n, max_tokens=steps), RequestMetrics(0), steps, [2]
    )
    req.seqs = [SeqState(index=i) for i in range(n)]
    prev, seen = None, []
    for t in range(1, steps + 1):
        changed = 0
        for s in req.seqs:  # sample i finishes at step 2 + i
            if s.finish_reason is None:
                s.token_ids.append(t)
                s.text += f" {t}"
                changed += 1
                if t >= 2 + s.index:
                    s.finish_reason = "length"
        out = req.to_output()
        seen.append((out, copy.deepcopy(out)))
        assert [c.token_ids for c in out.outputs] == [s.token_ids for s in req.seqs]
        if prev is not None:  # a sample that did not change is the previous output's object
            fresh = sum(c is not p for c, p in zip(out.outputs, prev.outputs))
            assert fresh == changed, (t, fresh, changed)
            assert out.prompt_token_ids is prev.prompt_token_ids  # the prompt: copied once
        assert out.prompt_token_ids == [1, 2] and out.prompt_token_ids is not req.prompt_token_ids
        prev = out
    assert out.finished
    # No sample handed out was changed afterwards (the metrics object is shared, as before).
    assert all(o.outputs == kept.outputs for o, kept in seen)


def test_streamed_n_samples_equal_the_final_output(engine: AsyncLLMEngine) -> None:
    # Samples that finish early stop changing while the others go on (with this seed two of
    # the four stop on "," at their second token, the others run to max_tokens).
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=12, stop_token_ids=[30])

    async def run() -> list:
        return [out async for out in engine.generate(PROMPT, params, "gen-n")]

    outs = asyncio.run(run())
    final = outs[-1]
    assert final.finished and len(final.outputs) == 4
    for c in final.outputs:
        for out in outs:  # every streamed state is a prefix of the final one
            s = out.outputs[c.index]
            assert c.token_ids[: len(s.token_ids)] == s.token_ids and c.text.startswith(s.text)
    # The same seed without streaming (one final output) agrees.
    direct = asyncio.run(_final(engine, params.clone(), "gen-n-final"))
    assert [c.token_ids for c in direct.outputs] == [c.token_ids for c in final.outputs]
    assert [c.text for c in direct.outputs] == [c.text for c in final.outputs]
    wait_idle(engine)


async def _final(engine: AsyncLLMEngine, params: SamplingParams, rid: str):
    params.output_kind = "final_only"
    outs = [out async for out in engine.generate(PROMPT, params, rid)]
    assert len(outs) == 1
    return outs[0]


def test_add_request_errors_are_json(
    engine: AsyncLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the engine raises when a request is added reaches the client as a JSON error: a
    ValueError about the priority as a 400 naming it (vLLM's words when priority scheduling
    is off), anything else (a C++ binding's TypeError, ...) as a 500, never Starlette's
    text/plain "Internal Server Error"."""
    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    raised: list = []

    async def add_request(*args, **kwargs):
        raise raised[-1]

    monkeypatch.setattr(engine, "add_request", add_request)
    with TestClient(build_app(engine), raise_server_exceptions=False) as http:
        for route, body in [
            ("/v1/completions", {"prompt": PROMPT}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ]:
            raised.append(ValueError("Got priority 5 but Priority scheduling is not enabled."))
            r = http.post(route, json={**body, "max_tokens": 2, "priority": 5})
            assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
            raised.append(TypeError("add_request(): incompatible function arguments"))
            r = http.post(route, json={**body, "max_tokens": 2})
            assert r.status_code == 500, r.text
            assert r.headers["content-type"].startswith("application/json")
            assert "incompatible function arguments" in r.json()["error"]["message"]


def test_a_failed_step_fails_its_requests_and_the_engine_serves_on(
    engine: AsyncLLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One step raising (a bug, a value the sampler cannot take) aborts the requests it ran:
    their callers get StepFailedError (over HTTP a JSON 500), and the engine stays alive for
    the next ones, with nothing leaked."""
    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    llm_engine = engine.engine
    real = llm_engine.runner.execute
    fail_next = [True]

    def flaky(plan, *args, **kwargs):  # type: ignore[no-untyped-def]
        if fail_next[0]:
            fail_next[0] = False
            raise RuntimeError("simulated one-off failure")
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(llm_engine.runner, "execute", flaky)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)

    async def run(rid: str) -> list:
        return [out async for out in engine.generate(PROMPT, params, rid)]

    with pytest.raises(StepFailedError, match="simulated one-off failure"):
        asyncio.run(asyncio.wait_for(run("victim"), timeout=30))
    assert not engine.is_dead
    assert len(asyncio.run(run("after"))[-1].outputs[0].token_ids) == 4
    wait_idle(engine)
    # raise_server_exceptions=False: the 500 the server answers, not the exception Starlette
    # re-raises after it for logging.
    with TestClient(build_app(engine), raise_server_exceptions=False) as http:
        fail_next[0] = True
        r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 500 and "simulated" in r.json()["error"]["message"], r.text
        assert http.get("/health").status_code == 200
        r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 200, r.text
    wait_idle(engine)


def test_zz_engine_death_fails_requests_and_health(engine: AsyncLLMEngine) -> None:
    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    app = build_app(engine)
    with TestClient(app) as http:
        assert http.get("/health").status_code == 200

        def broken_step():
            raise RuntimeError("simulated device failure")

        engine.engine.step = broken_step  # the engine is discarded after this test

        async def run() -> None:
            async for _ in engine.generate(PROMPT, SamplingParams(max_tokens=4), "doomed"):
                pass

        with pytest.raises(EngineDeadError, match="simulated device failure"):
            asyncio.run(asyncio.wait_for(run(), timeout=30))
        assert engine.is_dead
        health = http.get("/health")
        assert health.status_code == 503 and "simulated" in health.json()["error"]["message"]
        with pytest.raises(EngineDeadError):
            asyncio.run(run())
        r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 503, r.text
