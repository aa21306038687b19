"""Stop strings through the whole engine, on a tiny random Llama with the SmolLM2 tokenizer
(about 3 s, against minutes for the default-model tests that cover the same path).

The expected texts are derived from the engine's own unstopped greedy text: a stop string cuts
the text just before its first occurrence (or after it, with include_stop_str_in_output), and
the text streamed before the end is always a prefix of the final text (nothing shown is taken
back: a possible start of a stop string is held back).
"""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")
need("transformers")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm(tmp_path_factory, smollm2_gguf: str) -> LLM:
    out = str(tmp_path_factory.mktemp("tiny_text"))
    path = save_random_model(
        out,
        "tiny-llama",
        seed=3,
        tokenizer=True,
        head_dim=32,  # wider heads than the preset's 16
        vocab_size=49152,
        max_position_embeddings=1024,
    )
    return LLM(
        path,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=128,
        seed=0,
    )


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def full_text(llm: LLM) -> str:
    text = llm.generate(PROMPT, _greedy(), use_tqdm=False)[0].outputs[0].text
    assert len(text) > 60
    return text


def _stop_in(text: str, start: int = 20) -> tuple[str, int]:
    """A 4-character stop string of `text` at its first occurrence, from `start` on."""
    for i in range(start, len(text) - 4):
        s = text[i : i + 4]
        if text.find(s) == i and s.strip():
            return s, i
    raise AssertionError("no usable stop string")


def test_stop_string_cuts_the_text(llm: LLM, full_text: str) -> None:
    stop, i = _stop_in(full_text)
    out = llm.generate(PROMPT, _greedy(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == (full_text[:i], "stop", stop)
    keep = llm.generate(
        PROMPT, _greedy(stop=[stop], include_stop_str_in_output=True), use_tqdm=False
    )[0].outputs[0]
    assert keep.text == full_text[: i + len(stop)] and keep.finish_reason == "stop"
    # Two stop strings: the one that occurs first wins, whatever the list order.
    later, j = _stop_in(full_text[i + 4 :])
    both = llm.generate(PROMPT, _greedy(stop=[later, stop]), use_tqdm=False)[0].outputs[0]
    assert (both.text, both.stop_reason) == (full_text[:i], stop)
    # A stop string ends the sequence in the scheduler too: nothing keeps running, no block held.
    sched = llm.llm_engine.scheduler
    assert not sched.has_unfinished_requests()
    assert sched.num_free_blocks == llm.llm_engine.num_gpu_blocks


def _stream(llm: LLM, rid: str, params: SamplingParams) -> list[str]:
    eng = llm.llm_engine
    eng.add_request(rid, PROMPT, params)
    shown = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            shown.append(o.outputs[0].text)
    return shown


def test_streamed_text_is_never_taken_back(llm: LLM, full_text: str) -> None:
    steps = _stream(llm, "plain", _greedy())
    assert steps[-1] == full_text
    # A stop string across a token boundary in the second half: 2 characters before it, 2 after.
    # At the step that ends on the boundary the text ends with the stop's first half, which
    # must be held back, since the next token completes the stop and it is cut.
    for b in sorted({len(t) for t in steps}):
        stop = full_text[b - 2 : b + 2]
        if b > len(full_text) // 2 and len(stop) == 4 and full_text.find(stop) == b - 2:
            break
    else:
        raise AssertionError("no usable token boundary")
    shown = _stream(llm, "stopped", _greedy(stop=[stop]))
    final = shown[-1]
    assert final == full_text[: b - 2]
    assert len(shown) > 5
    for t in shown:
        assert final.startswith(t), (t, final)  # the stop's first half never leaks
