"""Large n (SamplingParams(n=...)): memory is bounded by the batch limits, not by n.

The n samples of a prompt are drawn from one row of logits when the prompt completes; the
engine must not hold an [n, vocab] batch (plus the sampler's copies) at once, which made
n=100000 grow past the machine's memory.
"""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import SMOLLM2_PROMPTS, assert_no_leak

need("torch")
need("gguf")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str) -> LLM:
    return LLM(device="cpu", kv_cache_space=0.25, max_model_len=256, max_num_seqs=MAX_NUM_SEQS)


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def _peak_rss_growth_mb(fn) -> float:
    """Peak resident memory while fn() runs, above the resident memory before it (Linux:
    writing 5 to clear_refs resets the peak, VmHWM, to the current RSS)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kb("VmRSS")
    except (OSError, KeyError) as e:
        pytest.skip(f"cannot reset the peak RSS on this system: {e}")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


def test_sampling_batches_stay_within_max_num_seqs(llm):
    # Every call into the sampler (and so every [rows, vocab] logits batch) has at most
    # max_num_seqs rows, however large n is.
    eng = llm.llm_engine
    sizes = []
    real = eng.core.sampler  # the engine core samples

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, logits, rows):
            sizes.append(logits.shape[0])
            return real(logits, rows)

    eng.core.sampler = Spy()
    try:
        out = llm.generate(
            [[1]], SamplingParams(n=10 * MAX_NUM_SEQS + 3, max_tokens=1, seed=11), use_tqdm=False
        )[0]
    finally:
        eng.core.sampler = real
    assert len(out.outputs) == 10 * MAX_NUM_SEQS + 3
    assert sizes and max(sizes) <= MAX_NUM_SEQS and sum(sizes) == 10 * MAX_NUM_SEQS + 3
    assert_no_leak(llm)


def test_large_n_memory_is_bounded_and_results_correct(llm):
    small_n, big_n = 10, 1000
    params = dict(max_tokens=1, temperature=1.0, seed=5)
    res = {}

    def run(n):
        res[n] = llm.generate([[1]], SamplingParams(n=n, **params), use_tqdm=False)[0]

    run(small_n)  # warm up (first-call allocations are not per sample)
    small = _peak_rss_growth_mb(lambda: run(small_n))
    big = _peak_rss_growth_mb(lambda: run(big_n))
    # Before the fix each extra sample cost about 1 MB (an [n, 49152] fp32 logits batch and
    # the sampler's copies): ~2 GB here. Now the extra samples cost only their bookkeeping.
    per_sample_kb = (big - small) * 1024 / (big_n - small_n)
    assert per_sample_kb < 32, f"{per_sample_kb:.0f} KB per extra sample ({small=} {big=} MB)"
    outs = res[big_n].outputs
    assert [c.index for c in outs] == list(range(big_n))
    assert all(len(c.token_ids) == 1 and c.finish_reason == "length" for c in outs)
    assert len({c.token_ids[0] for c in outs}) > 10  # temperature 1: the samples differ
    # Seeded: sample i depends on the seed and i only, not on n or on the chunking.
    assert [c.token_ids for c in outs[:small_n]] == [c.token_ids for c in res[small_n].outputs]
    assert_no_leak(llm)


def test_more_samples_than_seats_decode_correctly(llm):
    # n > max_num_seqs with several tokens: the children that find no seat wait, re-prefill
    # their prompt (from the prefix cache) and still match a single greedy request.
    prompt = SMOLLM2_PROMPTS[0]
    greedy = dict(temperature=0, max_tokens=3, ignore_eos=True)
    ref = llm.generate(prompt, SamplingParams(**greedy), use_tqdm=False)[0].outputs[0].token_ids
    out = llm.generate(prompt, SamplingParams(n=3 * MAX_NUM_SEQS + 1, **greedy), use_tqdm=False)[0]
    assert len(out.outputs) == 3 * MAX_NUM_SEQS + 1
    assert all(c.token_ids == ref for c in out.outputs)
    seeded = SamplingParams(
        n=MAX_NUM_SEQS + 3, temperature=0.8, seed=2, max_tokens=3, ignore_eos=True
    )
    a = llm.generate(prompt, seeded, use_tqdm=False)[0]
    b = llm.generate(prompt, seeded, use_tqdm=False)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1
    assert_no_leak(llm)
