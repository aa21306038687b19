"""What LLMEngine hands out and what it must still do on a step with nothing to run: output
snapshots (metrics), vLLM's RequestOutput fields (num_cached_tokens), detokenizer flags, and the
cache work of a plan of zero sequences. Embedded SmolLM2 on the CPU."""

from __future__ import annotations

import pytest
from deps import need
from engine_checks import assert_no_leak, cpu_llm

torch = need("torch")
need("transformers")
need("gguf")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str) -> LLM:
    return cpu_llm(0.05, 256, num_gpu_blocks_override=64, preemption_mode="swap",
                   num_cpu_blocks=8)


def _stream(llm: LLM, rid: str, prompt, params: SamplingParams) -> list:
    eng = llm.llm_engine
    eng.add_request(rid, prompt, params)
    outs = []
    while eng.has_unfinished_requests():
        outs += [o for o in eng.step() if o.request_id == rid]
    return outs


def test_streamed_outputs_keep_their_own_metrics(llm: LLM) -> None:
    outs = _stream(llm, "metrics", "Hello there", SamplingParams(temperature=0, max_tokens=5))
    assert len(outs) == 5 and outs[-1].finished and not outs[0].finished
    first, last = outs[0].metrics, outs[-1].metrics
    assert first is not last
    # The first output still describes its own step: one token, not finished.
    assert first.finished_time is None and last.finished_time is not None
    assert first.last_token_time == first.first_token_time
    assert last.last_token_time >= first.last_token_time
    assert first.arrival_time == last.arrival_time
    assert_no_leak(llm)
