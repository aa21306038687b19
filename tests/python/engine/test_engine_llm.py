"""LLM / LLMEngine end to end on the embedded SmolLM2 (CPU, fp32).

The reference is HF transformers on the same GGUF file (greedy tokens, logprobs); the other
tests check invariances (batching, chunking, prefix cache, preemption, n > 1, seeds) against the
engine's own single-request greedy output, and that no KV block is left allocated.
"""

from __future__ import annotations

import os

import pytest
from support.deps import need
from support.engine import SMOLLM2_PROMPTS, assert_no_leak, cpu_llm

torch = need("torch")
transformers = need("transformers")
need("gguf")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

PROMPTS = SMOLLM2_PROMPTS[:4]
HF_PROMPTS = SMOLLM2_PROMPTS
GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def _make(**kw) -> LLM:
    return cpu_llm(0.25, 1024, **kw)


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str) -> LLM:
    return _make()


@pytest.fixture(scope="module")
def reference(llm: LLM) -> dict:
    """Greedy output of each prompt run alone (the invariance tests' reference)."""
    out = {p: llm.generate(p, GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS}
    assert_no_leak(llm)
    return out


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf: str):
    path = smollm2_gguf
    need("accelerate")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    return model.eval()


def test_greedy_matches_hf_transformers(llm, hf_model):
    """Same tokens as HF generate (greedy, EOS honoured by both) over several prompts."""
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=48)
    outs = llm.generate(HF_PROMPTS, params, use_tqdm=False)
    lengths = []
    for prompt, out in zip(HF_PROMPTS, outs):
        ids = torch.tensor([tok.encode(prompt)])
        with torch.no_grad():
            hf = hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=48,
                pad_token_id=tok.eos_token_id,
            )
        expected = hf[0, ids.shape[1] :].tolist()
        got = out.outputs[0]
        assert got.token_ids == expected, prompt
        assert out.prompt_token_ids == ids[0].tolist()
        assert got.text == tok.decode(expected)
        reason = "stop" if expected[-1] == tok.eos_token_id else "length"
        assert got.finish_reason == reason and out.finished
        lengths.append(len(expected))
    assert sum(n >= 32 for n in lengths) >= 3, lengths
    assert_no_leak(llm)


def test_logprobs_match_hf(llm, hf_model):
    tok = llm.get_tokenizer()
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=0, max_tokens=6, logprobs=3, prompt_logprobs=2)
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    ids = out.prompt_token_ids + out.outputs[0].token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].double(), -1)
    n_prompt = len(out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == n_prompt
    for pos in range(1, n_prompt):
        d = out.prompt_logprobs[pos]
        assert abs(d[ids[pos]].logprob - ref[pos - 1, ids[pos]].item()) < 1e-3
        top = ref[pos - 1].topk(2).indices.tolist()
        assert top[0] in d
    total = 0.0
    for j, d in enumerate(out.outputs[0].logprobs):
        t = out.outputs[0].token_ids[j]
        row = ref[n_prompt + j - 1]
        assert d[t].rank == 1 and abs(d[t].logprob - row.max().item()) < 1e-3
        assert set(row.topk(3).indices.tolist()) <= set(d)
        assert d[t].decoded_token == tok.decode([t], skip_special_tokens=False)
        total += d[t].logprob
    assert out.outputs[0].cumulative_logprob == pytest.approx(total, abs=1e-4)
    assert_no_leak(llm)


def test_batching_and_prefix_cache_do_not_change_results(llm, reference):
    eng = llm.llm_engine
    hits_before = eng.get_stats()["prefix_cache_hits"]
    # The batch repeats prompts (prefix-cache hits) and mixes in other sampling requests.
    prompts = PROMPTS + PROMPTS[:2] + ["Random words:"] * 2
    params = [GREEDY] * 6 + [SamplingParams(temperature=1.0, max_tokens=30)] * 2
    outs = llm.generate(prompts, params, use_tqdm=False)
    for p, o in zip(prompts[:6], outs[:6]):
        assert o.outputs[0].token_ids == reference[p], p
    # A prompt sharing a cached prefix: hit on the second run, same output as the first.
    long_prompt = PROMPTS[2] + " a fisherman who" * 4
    first = llm.generate(long_prompt, GREEDY, use_tqdm=False)[0]
    mid = eng.get_stats()["prefix_cache_hits"]
    again = llm.generate(long_prompt, GREEDY, use_tqdm=False)[0]
    assert eng.get_stats()["prefix_cache_hits"] > mid >= hits_before
    assert again.outputs[0].token_ids == first.outputs[0].token_ids
    assert_no_leak(llm)


def test_chunked_prefill_does_not_change_results(llm, reference):
    small = _make(max_num_batched_tokens=8, max_num_seqs=4)
    outs = small.generate(PROMPTS, GREEDY, use_tqdm=False)
    for p, o in zip(PROMPTS, outs):
        assert o.outputs[0].token_ids == reference[p], p
    assert_no_leak(small)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_does_not_change_results(llm, reference, mode):
    # 10 blocks of 16 tokens: the four requests (~55 tokens each at the end) cannot all fit.
    tiny = _make(
        num_gpu_blocks_override=10,
        max_model_len=160,
        preemption_mode=mode,
        num_cpu_blocks=64 if mode == "swap" else None,
    )
    outs = tiny.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert tiny.llm_engine.get_stats()["num_preemptions"] > 0
    for p, o in zip(PROMPTS, outs):
        assert o.outputs[0].token_ids == reference[p], (mode, p)
    assert_no_leak(tiny)


def test_n_samples_fork_and_match_single_requests(llm, reference):
    outs = llm.generate(
        PROMPTS[0],
        SamplingParams(n=3, temperature=0, max_tokens=40, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert [c.index for c in outs.outputs] == [0, 1, 2]
    for c in outs.outputs:
        assert c.token_ids == reference[PROMPTS[0]]
    # Seeded sampling: sample i of an n=3 request is reproducible run to run.
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=7, max_tokens=20)
    a = llm.generate(PROMPTS[1], params, use_tqdm=False)[0]
    b = llm.generate([PROMPTS[3], PROMPTS[1]], params, use_tqdm=False)[1]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1  # the samples differ
    # best_of=3, n=1 returns the most likely of the same three samples.
    scored = llm.generate(
        PROMPTS[1],
        SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=7, max_tokens=20, logprobs=0),
        use_tqdm=False,
    )[0].outputs
    assert [c.token_ids for c in scored] == [c.token_ids for c in a.outputs]
    best = llm.generate(
        PROMPTS[1],
        SamplingParams(n=1, best_of=3, temperature=1.0, top_p=0.9, seed=7, max_tokens=20),
        use_tqdm=False,
    )[0].outputs
    winner = max(scored, key=lambda c: c.cumulative_logprob)
    assert len(best) == 1 and best[0].token_ids == winner.token_ids
    assert best[0].cumulative_logprob == pytest.approx(winner.cumulative_logprob, abs=1e-4)
    assert_no_leak(llm)


def test_seed_reproduces_regardless_of_batch(llm):
    p = SamplingParams(temperature=0.9, top_k=50, seed=1234, max_tokens=24)
    alone = llm.generate(PROMPTS[3], p, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=10, seed=s) for s in range(3)]
    batch = llm.generate(PROMPTS[:3] + [PROMPTS[3]], others + [p], use_tqdm=False)
    assert batch[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=0.9, top_k=50, seed=99, max_tokens=24)
    assert llm.generate(PROMPTS[3], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone
    assert_no_leak(llm)


def test_finish_reasons(llm, reference):
    tok = llm.get_tokenizer()
    ref = reference[PROMPTS[0]]
    text = tok.decode(ref)
    # A stop string: the text ends right before it, finish_reason "stop", stop_reason the string.
    stop = text[6:10]
    out = llm.generate(
        PROMPTS[0], SamplingParams(temperature=0, max_tokens=40, stop=[stop]), use_tqdm=False
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == text[: text.index(stop)]
    keep = llm.generate(
        PROMPTS[0],
        SamplingParams(temperature=0, max_tokens=40, stop=stop, include_stop_str_in_output=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert keep.text == text[: text.index(stop) + len(stop)]
    # A stop token id: generation ends on it; its text is not shown.
    sid = ref[5]
    first = ref.index(sid)
    out = llm.generate(
        PROMPTS[0],
        SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[sid]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == sid
    assert out.token_ids == ref[: first + 1]
    # min_tokens bans the stop id until then.
    out = llm.generate(
        PROMPTS[0],
        SamplingParams(temperature=0, max_tokens=40, min_tokens=first + 3, stop_token_ids=[sid]),
        use_tqdm=False,
    )[0].outputs[0]
    assert len(out.token_ids) >= first + 3 and sid not in out.token_ids[: first + 2]
    # max_tokens.
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[
        0
    ].outputs[0]
    assert out.finish_reason == "length" and out.token_ids == ref[:3]
    assert_no_leak(llm)


def test_eos_and_chat(llm):
    tok = llm.get_tokenizer()
    conv = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    out = llm.chat(conv, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0]
    expected_prompt = tok.apply_chat_template(conv, add_generation_prompt=True)
    assert out.prompt == expected_prompt
    c = out.outputs[0]
    assert "Paris" in c.text
    assert c.finish_reason == "stop" and c.stop_reason is None  # ended on EOS
    assert c.token_ids[-1] == tok.eos_token_id
    both = llm.chat([conv, conv], SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    assert [o.outputs[0].text for o in both] == [c.text, c.text]
    assert_no_leak(llm)


def test_abort_and_validation(llm):
    eng = llm.llm_engine
    for i in range(3):
        eng.add_request(f"abort-{i}", PROMPTS[i], SamplingParams(max_tokens=50))
    eng.step()
    eng.step()
    assert eng.get_num_unfinished_requests() == 3
    eng.abort_request(["abort-0", "abort-1"])
    eng.abort_request("abort-2")
    assert not eng.has_unfinished_requests() and not eng.step()
    assert_no_leak(llm)
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request("long", None, SamplingParams(), prompt_token_ids=[1] * 1024)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        eng.add_request("bad", None, SamplingParams(), prompt_token_ids=[10**7])
    with pytest.raises(ValueError, match="temperature"):
        llm.generate("x", SamplingParams(temperature=-1))
    assert_no_leak(llm)


def test_token_id_prompts_and_order(llm, reference):
    tok = llm.get_tokenizer()
    ids = [tok.encode(p) for p in PROMPTS]
    outs = llm.generate(ids[::-1], GREEDY, use_tqdm=False)
    for p, o in zip(PROMPTS[::-1], outs):
        assert o.outputs[0].token_ids == reference[p] and o.prompt is None
    assert_no_leak(llm)


def test_dropped_engine_is_freed_without_the_cycle_collector(llm):
    # A reference cycle would leave a dropped engine (its KV cache, on CUDA its graphs) to the
    # cyclic collector, which may run at any allocation, e.g. inside another engine's CUDA
    # graph capture (test_engine_cuda covers that case).
    import gc
    import weakref

    other = _make(max_model_len=256)  # shares the module engine's weights
    outs = other.generate(
        PROMPTS[0],
        SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=4, logprobs=2),
        use_tqdm=False,
    )
    assert len(outs[0].outputs) == 2
    runner = weakref.ref(other.llm_engine.runner)
    gc.disable()
    try:
        del other, outs
        assert runner() is None, "a reference cycle keeps the dropped engine alive"
    finally:
        gc.enable()
