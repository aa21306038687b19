"""The engine with an fp8 KV cache (kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2", vLLM's names)
on the embedded SmolLM2 (CPU, fp32 weights).

Two references: an "auto" engine whose cache writes are first rounded by torch's own fp8 casts
(what an fp8 cache stores, computed independently of pagedkv's conversion: the fp8 engine must
match it exactly), and the plain "auto" engine (greedy tokens and logprobs stay close).
Prefill is chunked to 8 tokens so that even the first generated token reads earlier prompt
tokens back from the fp8 cache (a single-step prefill attends to the fresh keys/values).
"""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import SMOLLM2_PROMPTS, assert_no_leak, cpu_llm

torch = need("torch")
need("transformers")
need("gguf")

from pagedkv import ops  # noqa: E402
from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402
from pagedkv.entrypoints.engine_args import add_engine_arguments, engine_kwargs  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = SMOLLM2_PROMPTS
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
TORCH_FP8 = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def _make(kv_cache_dtype: str = "auto", **kw) -> LLM:
    kw.setdefault("max_num_batched_tokens", 8)  # chunked prefill: see the module docstring
    return cpu_llm(0.25, 256, kv_cache_dtype=kv_cache_dtype, **kw)


def _run(llm: LLM) -> list:
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_no_leak(llm)
    return [o.outputs[0] for o in outs]


@pytest.fixture(scope="module")
def auto_llm(smollm2_gguf: str) -> LLM:
    return _make("auto")


@pytest.fixture(scope="module")
def auto_out(auto_llm: LLM) -> list:
    return _run(auto_llm)


@pytest.fixture(scope="module")
def fp8_llm(smollm2_gguf: str) -> LLM:
    return _make("fp8")


@pytest.fixture(scope="module")
def fp8_out(fp8_llm: LLM) -> list:
    return _run(fp8_llm)


def _emulated(kv_cache_dtype: str, monkeypatch: pytest.MonkeyPatch) -> list:
    """The "auto" engine with every cache write rounded through torch's fp8 type first."""
    real, fp8 = ops.reshape_and_cache_flash, TORCH_FP8[kv_cache_dtype]

    def rounded_write(key, value, key_cache, value_cache, slot_mapping, dtype, k_scale, v_scale):
        assert dtype == "auto"
        real(
            key.to(fp8).to(key.dtype),
            value.to(fp8).to(value.dtype),
            key_cache,
            value_cache,
            slot_mapping,
            dtype,
            k_scale,
            v_scale,
        )

    monkeypatch.setattr(ops, "reshape_and_cache_flash", rounded_write)
    try:
        return _run(_make("auto"))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("bad", ["int4", "fp16", "FP8", ""])
def test_bad_kv_cache_dtype_is_a_value_error(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM(device="cpu", kv_cache_dtype=bad)
    import argparse

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    with pytest.raises(SystemExit):  # argparse choices reject it before any engine is built
        parser.parse_args(["--kv-cache-dtype", bad])


def test_cli_flag_reaches_the_engine_kwargs():
    import argparse

    from pagedkv.engine.config import KV_CACHE_DTYPES
    from pagedkv.entrypoints.engine_args import KV_CACHE_DTYPE_CHOICES

    assert KV_CACHE_DTYPE_CHOICES == KV_CACHE_DTYPES  # the parser's copy stays in step

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    assert engine_kwargs(parser.parse_args([]))["kv_cache_dtype"] == "auto"
    args = parser.parse_args(["--kv-cache-dtype", "fp8_e5m2"])
    assert engine_kwargs(args)["kv_cache_dtype"] == "fp8_e5m2"


def test_fp8_cache_is_bytes_with_four_times_the_blocks(auto_llm, fp8_llm, auto_out, fp8_out):
    auto_eng, fp8_eng = auto_llm.llm_engine, fp8_llm.llm_engine
    assert fp8_eng.config.kv_cache_dtype == "fp8"
    for cache in fp8_eng.runner.kv_caches:
        assert cache.dtype == torch.uint8
        assert cache.shape[1] == fp8_eng.num_gpu_blocks
    assert auto_eng.runner.kv_caches[0].dtype == torch.float32
    # Same kv_cache_space: 1 byte per element instead of 4 (up to the floor of the division).
    assert fp8_eng.num_gpu_blocks // 4 == auto_eng.num_gpu_blocks
    cache_bytes = sum(c.numel() * c.element_size() for c in fp8_eng.runner.kv_caches)
    assert cache_bytes <= 0.25 * (1 << 30)
    fp8_eng.runner._profile_run()  # the GPU memory profile's forward, on a uint8 dummy cache


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_engine_matches_torch_rounded_cache(kv_cache_dtype, fp8_out, monkeypatch):
    """Same tokens and logprobs as an fp32 cache holding torch-rounded fp8 values: the cache
    stores exactly fp8(x) (x / scale, scale 1.0) and the kernels read it back exactly."""
    got = fp8_out if kv_cache_dtype == "fp8" else _run(_make(kv_cache_dtype))
    ref = _emulated(kv_cache_dtype, monkeypatch)
    for g, r in zip(got, ref):
        assert g.token_ids == r.token_ids
        for lg, lr in zip(g.logprobs, r.logprobs):
            assert set(lg) == set(lr)
            for tid in lg:
                # Only the summation order may differ between the two runs' kernels.
                assert abs(lg[tid].logprob - lr[tid].logprob) < 1e-4


# Measured on these prompts (CPU, fp32 weights): over the steps where both runs still agree, the
# chosen token's logprob moves by at most 0.18 (e4m3) / 0.40 (e5m2). e4m3 keeps 3 mantissa bits
# (relative error <= 2^-4 per element), e5m2 2 bits (<= 2^-3, so about twice the deviation);
# SmolLM2's keys reach |x| ~ 20, so a logit's error can reach a few tenths on an uncertain
# step. The bounds leave ~1.5x margin over the measurement.
LOGPROB_TOL = {"fp8": 0.3, "fp8_e5m2": 0.6}


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_greedy_close_to_auto(kv_cache_dtype, auto_out, fp8_out):
    got = fp8_out if kv_cache_dtype == "fp8" else _run(_make(kv_cache_dtype))
    agreed, max_dev = 0, 0.0
    for g, a in zip(got, auto_out):
        same = next(
            (i for i, (x, y) in enumerate(zip(g.token_ids, a.token_ids)) if x != y),
            len(a.token_ids),
        )
        assert same >= 2, (g.token_ids, a.token_ids)  # the first tokens are identical
        agreed += same
        for j in range(same):
            tid = a.token_ids[j]
            assert g.logprobs[j][tid].rank == 1  # top-1 equals auto's
            dev = abs(g.logprobs[j][tid].logprob - a.logprobs[j][tid].logprob)
            max_dev = max(max_dev, dev)
    assert max_dev < LOGPROB_TOL[kv_cache_dtype], max_dev
    assert max_dev > 1e-4, "fp8 rounding changed nothing: is the cache really fp8?"
    # Greedy paths split only where auto's top two are near-tied; most tokens agree (measured:
    # 39 of 48 with e4m3, 36 with e5m2).
    assert agreed >= 0.6 * len(PROMPTS) * GREEDY.max_tokens, agreed


def test_fp8_swap_preemption_and_fork(fp8_out):
    """Swapped-out blocks (host uint8 caches) and copy-on-write forks keep the fp8 bytes."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ref = _make("fp8", max_num_batched_tokens=None).generate(PROMPTS[:4], params, use_tqdm=False)
    tiny = _make(
        "fp8",
        max_num_batched_tokens=None,
        num_gpu_blocks_override=10,
        max_model_len=160,
        preemption_mode="swap",
        num_cpu_blocks=64,
    )
    assert tiny.llm_engine.runner.cpu_caches[0].dtype == torch.uint8
    got = tiny.generate(PROMPTS[:4], params, use_tqdm=False)
    assert tiny.llm_engine.get_stats()["num_preemptions"] > 0
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    forked = tiny.generate(
        PROMPTS[0],
        SamplingParams(n=3, temperature=0, max_tokens=20, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert [c.token_ids for c in forked.outputs] == [ref[0].outputs[0].token_ids[:20]] * 3
    assert_no_leak(tiny)
