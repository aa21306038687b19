"""An exception inside LLMEngine.step() (a bug, a value the sampler cannot take, Ctrl-C during
LLM.generate) fails the requests of that step, frees their blocks and leaves the engine usable.

Before, the plan of the failed step was never passed to the scheduler's update(), so every later
step raised "schedule(): the previous plan was not passed to update() yet": one Ctrl-C, or one
request with logprobs=10**6, broke the LLM for good.
"""

from __future__ import annotations

import sys

import pytest
from support.deps import need
from support.engine import SMOLLM2_PROMPTS, assert_no_leak, cpu_llm

need("torch")
need("gguf")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.model_runner import ModelRunner  # noqa: E402
from pagedkv.engine.output_processor import OutputProcessor  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402
from pagedkv.engine.step_sampling import StepSampling  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = SMOLLM2_PROMPTS[:4]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _make(**kw) -> LLM:
    return cpu_llm(0.05, 256, **kw)


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str) -> LLM:
    return _make()


@pytest.fixture(scope="module")
def reference(llm: LLM) -> dict:
    return {p: llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS}


def _raise_once(monkeypatch, cls, name, exc, on_call=1, when=None):
    """Patches cls.name to raise `exc` on its `on_call`-th call (counting only the calls for
    which `when(*args)` holds, if given); every other call runs the original."""
    orig = getattr(cls, name)
    state = {"calls": 0, "raised": False}

    def patched(*args, **kwargs):
        if not state["raised"] and (when is None or when(*args)):
            state["calls"] += 1
            if state["calls"] == on_call:
                state["raised"] = True
                raise exc
        return orig(*args, **kwargs)

    monkeypatch.setattr(cls, name, patched)
    return state


# Where the step fails: in the forward (before the plan's update), in sampling, and after the
# scheduler's update() (while the engine applies the tokens and text).
WHERE = [(ModelRunner, "execute"), (StepSampling, "run"), (OutputProcessor, "_accept_token")]


@pytest.mark.parametrize("cls,name", WHERE, ids=[n for _, n in WHERE])
def test_interrupted_generate_leaves_the_engine_usable(llm, reference, monkeypatch, cls, name):
    eng = llm.llm_engine
    assert_no_leak(llm)
    # Ctrl-C in the middle of a batch: a few decode steps in.
    state = _raise_once(monkeypatch, cls, name, KeyboardInterrupt(), on_call=4)
    with pytest.raises(KeyboardInterrupt) as info:
        llm.generate(
            PROMPTS, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True), use_tqdm=False
        )
    assert state["raised"]
    if sys.version_info >= (3, 11):  # exception notes
        assert any("aborted" in note for note in getattr(info.value, "__notes__", []))
    monkeypatch.undo()
    assert not eng.seq_owner
    assert_no_leak(llm)  # every block back: the free count is the baseline again
    # The next generate works and gives the same tokens as before the interrupt.
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        assert o.outputs[0].token_ids == reference[p], p
    assert_no_leak(llm)


def test_failed_step_fails_only_its_requests(llm, reference, monkeypatch):
    # max_num_seqs=1: one request runs, the other waits outside the failing step and finishes.
    one = _make(max_num_seqs=1)
    eng = one.llm_engine
    eng.add_request("a", PROMPTS[0], GREEDY)
    eng.add_request("b", PROMPTS[1], GREEDY)
    eng.step()
    _raise_once(monkeypatch, StepSampling, "run", RuntimeError("sampler bug"))
    with pytest.raises(RuntimeError, match="sampler bug"):
        eng.step()
    monkeypatch.undo()
    assert list(eng.requests) == ["b"]
    outs = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            outs[out.request_id] = out
    assert list(outs) == ["b"] and outs["b"].outputs[0].token_ids == reference[PROMPTS[1]]
    assert_no_leak(one)


def test_failed_n_samples_step_after_the_fork(llm, monkeypatch):
    # n = 3 samples fork from the parent after its prompt; fail the step after that: an
    # interrupt fails the step (every request of it), an error of the request's own work
    # (here its detokenization) fails that request alone, with its error (issue #25).
    eng = llm.llm_engine
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=30, ignore_eos=True)
    eng.add_request("n3", PROMPTS[2], params)
    # The prompt, and the forks (applied a step later by the overlapped loop).
    while len(eng.seq_owner) < 3:
        eng.step()
    _raise_once(monkeypatch, OutputProcessor, "_accept_token", KeyboardInterrupt(), 2)
    with pytest.raises(KeyboardInterrupt):
        for _ in range(3):  # (overlapped, the step in flight has the parent's token alone)
            eng.step()
    monkeypatch.undo()
    assert not eng.requests and not eng.seq_owner and not eng.step()
    assert_no_leak(llm)
    eng.add_request("n3", PROMPTS[2], params)
    while len(eng.seq_owner) < 3:
        eng.step()
    _raise_once(monkeypatch, OutputProcessor, "_accept_token", ValueError("detokenizer bug"), 2)
    outs: list = []
    while not any(o.finished for o in outs):  # no exception: the request failed alone
        outs = eng.step()
    monkeypatch.undo()
    assert [o.request_id for o in outs] == ["n3"] and outs[0].finished
    assert {c.finish_reason for c in outs[0].outputs} == {"abort"}
    assert "detokenizer bug" in repr(eng.take_request_errors()["n3"])
    assert not eng.requests and not eng.seq_owner and not eng.step()
    assert_no_leak(llm)
    again = llm.generate(PROMPTS[2], params, use_tqdm=False)[0]
    assert len(again.outputs) == 3 and all(len(c.token_ids) == 30 for c in again.outputs)
    assert_no_leak(llm)


def test_failed_step_keeps_swapped_out_requests_intact(llm, reference, monkeypatch):
    # The failing plan swaps requests out to host memory. They are not in the plan, so they go
    # on; their KV must still reach the host blocks (the swap-out comes first in the forward,
    # which here fails before it starts), or they resume from garbage. The serial loop: the
    # overlapped one also aborts the step in flight, which held the requests swapped out now
    # (test_engine_overlap's failed-step case covers that loop).
    tiny = _make(
        num_gpu_blocks_override=8,
        max_model_len=128,
        preemption_mode="swap",
        num_cpu_blocks=64,
        async_scheduling=False,
    )
    eng = tiny.llm_engine
    long = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    want = {p: llm.generate(p, long, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS}
    state = _raise_once(
        monkeypatch,
        ModelRunner,
        "execute",
        RuntimeError("forward failed"),
        when=lambda self, plan: len(plan.blocks_to_swap_out) > 0,
    )
    for i, p in enumerate(PROMPTS):
        eng.add_request(str(i), p, long)
    outs, failures = {}, 0
    while eng.has_unfinished_requests():
        try:
            for out in eng.step():
                if out.finished:
                    outs[out.request_id] = out
        except RuntimeError as e:
            assert "forward failed" in str(e)
            failures += 1
    assert state["raised"] and failures == 1
    survivors = [rid for rid in map(str, range(4)) if rid in outs]
    assert 0 < len(survivors) < 4
    for rid in survivors:
        assert outs[rid].outputs[0].token_ids == want[PROMPTS[int(rid)]], rid
    assert tiny.llm_engine.scheduler.num_swapped == 0
    assert_no_leak(tiny)


@pytest.mark.parametrize("field", ["logprobs", "prompt_logprobs"])
def test_logprobs_are_capped_when_the_request_is_added(llm, field):
    eng = llm.llm_engine
    # Before: RuntimeError "selected index k out of range" inside the step, engine broken.
    for k in (21, 10**6):
        with pytest.raises(ValueError, match=rf"greater than max allowed: 20 .*{field}"):
            llm.generate(["Hi"], SamplingParams(max_tokens=2, **{field: k}), use_tqdm=False)
        with pytest.raises(ValueError, match="max allowed"):
            eng.add_request("big", "Hi", SamplingParams(**{field: k}))
        assert "big" not in eng.requests
    assert_no_leak(llm)
    out = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=2, **{field: 20}), use_tqdm=False)[0]
    got = out.outputs[0].logprobs if field == "logprobs" else out.prompt_logprobs
    assert got is not None and max(len(d) for d in got if d) >= 20
    assert_no_leak(llm)


def test_max_logprobs_engine_argument(llm):
    wide = _make(max_logprobs=30)
    out = wide.generate(["Hi"], SamplingParams(max_tokens=1, logprobs=25), use_tqdm=False)[0]
    assert len(out.outputs[0].logprobs[0]) >= 25
    with pytest.raises(ValueError, match="max allowed: 30"):
        wide.generate(["Hi"], SamplingParams(max_tokens=1, logprobs=31), use_tqdm=False)
    # -1: no cap but the vocabulary (vLLM's meaning).
    vocab = llm.llm_engine.model_config.vocab_size
    uncapped = _make(max_logprobs=-1)
    with pytest.raises(ValueError, match=f"max allowed: {vocab}"):
        uncapped.generate(
            ["Hi"], SamplingParams(max_tokens=1, prompt_logprobs=vocab + 1), use_tqdm=False
        )
    with pytest.raises(ValueError, match="max_logprobs"):
        _make(max_logprobs=-2)
    assert_no_leak(wide)
    assert_no_leak(uncapped)
