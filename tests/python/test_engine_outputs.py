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


def test_num_cached_tokens_counts_prefix_cache_hits(llm: LLM) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 5  # 51 tokens
    params = SamplingParams(temperature=0, max_tokens=2)
    first = llm.generate(prompt, params, use_tqdm=False)[0]
    again = llm.generate(prompt, params, use_tqdm=False)[0]
    n = len(again.prompt_token_ids)
    assert first.num_cached_tokens == 0
    # Whole blocks of 16 are reused, capped at prompt - 1 tokens (one must be computed).
    assert again.num_cached_tokens == (n - 1) // 16 * 16 > 0
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert_no_leak(llm)
