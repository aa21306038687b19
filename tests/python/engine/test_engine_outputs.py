"""What LLMEngine hands out and what it must still do on a step with nothing to run: output
snapshots (metrics), vLLM's RequestOutput fields (num_cached_tokens), detokenizer flags, and the
cache work of a plan of zero sequences. Embedded SmolLM2 on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak, cpu_llm

torch = need("torch")
need("transformers")
need("gguf")

from pagedkv.engine.llm import LLM  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str) -> LLM:
    return cpu_llm(0.05, 256, num_gpu_blocks_override=64, preemption_mode="swap", num_cpu_blocks=8)


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


class _Plan:
    """A plan of zero sequences that still moves blocks (what step() must not drop)."""

    def __init__(self, step: int, swap_out=(), swap_in=(), copy=()) -> None:
        self.step, self.num_seqs = step, 0
        pairs = lambda p: np.asarray(p, dtype=np.int64).reshape(-1, 2)  # noqa: E731
        self.blocks_to_swap_out = pairs(swap_out)
        self.blocks_to_swap_in = pairs(swap_in)
        self.blocks_to_copy = pairs(copy)
        self.request_ids: list = []


class _Scheduler:
    def __init__(self, real, plan: _Plan) -> None:
        self._real, self._plan = real, plan

    def schedule(self) -> _Plan:
        return self._plan

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def test_step_with_no_sequences_still_moves_blocks(llm: LLM) -> None:
    eng = llm.llm_engine
    runner = eng.runner
    key, value = runner.kv_caches[0][0], runner.kv_caches[0][1]
    host_key = runner.cpu_caches[0][0]
    real = eng.scheduler
    try:
        key[3].fill_(7.0)
        value[3].fill_(5.0)
        host_key[1].fill_(0.0)
        eng.core.scheduler = _Scheduler(real, _Plan(10**9, swap_out=[(3, 1)]))
        assert eng.step() == []
        assert bool((host_key[1] == 7.0).all()), "the swap-out of an empty plan was dropped"
        host_key[2].fill_(9.0)
        eng.core.scheduler = _Scheduler(real, _Plan(10**9 + 1, swap_in=[(2, 4)], copy=[(3, 5)]))
        assert eng.step() == []
        assert bool((key[4] == 9.0).all()) and bool((value[5] == 5.0).all())
    finally:
        eng.core.scheduler = real
    out = llm.generate("Hi", SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert out[0].finished
    assert_no_leak(llm)


def test_spaces_between_special_tokens_reaches_the_detokenizer(llm: LLM) -> None:
    # SmolLM2's ByteLevel decoder puts nothing between special tokens (vLLM's output is the
    # same for both values there), so watch the flag arrive instead; the text itself is checked
    # on a WordPiece tokenizer in test_models_tokenizer.py.
    eng = llm.llm_engine
    real = eng.decoder
    seen: list = []

    class Spy:
        def decode(self, ids, skip_special_tokens=True, spaces_between_special_tokens=True):
            seen.append((skip_special_tokens, spaces_between_special_tokens))
            return real.decode(ids, skip_special_tokens, spaces_between_special_tokens)

    eng.decoder = Spy()
    try:
        for kind in ("final_only", "cumulative"):
            seen.clear()
            p = SamplingParams(
                temperature=0,
                max_tokens=3,
                skip_special_tokens=False,
                spaces_between_special_tokens=False,
                output_kind=kind,
            )
            _stream(llm, f"spaces-{kind}", "Hi", p)
            assert seen and all(s == (False, False) for s in seen), (kind, seen)
    finally:
        eng.decoder = real
    assert_no_leak(llm)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm: LLM) -> None:
    from pagedkv.engine.sampling_params import SamplingParams as SP

    prompt = "One two three four five six seven eight nine ten"
    ids = llm.get_tokenizer().encode(prompt)
    greedy = dict(temperature=0, max_tokens=4)
    out = llm.generate(prompt, SP(truncate_prompt_tokens=4, **greedy), use_tqdm=False)[0]
    assert out.prompt == prompt and out.prompt_token_ids == ids[-4:]
    alone = llm.generate({"prompt_token_ids": ids[-4:]}, SP(**greedy), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == alone.outputs[0].token_ids
    # Longer than the prompt: nothing cut; -1: all the model takes (here all of it).
    for k in (len(ids) + 5, -1):
        o = llm.generate(prompt, SP(truncate_prompt_tokens=k, **greedy), use_tqdm=False)[0]
        assert o.prompt_token_ids == ids
    long_ids = [100] * 300  # max_model_len is 256: -1 keeps 255, room for one token
    o = llm.generate(
        {"prompt_token_ids": long_ids}, SP(truncate_prompt_tokens=-1, max_tokens=1), use_tqdm=False
    )[0]
    assert len(o.prompt_token_ids) == 255 and len(o.outputs[0].token_ids) == 1
    for bad in (0, -2):
        with pytest.raises(ValueError, match="truncate_prompt_tokens"):
            SP(truncate_prompt_tokens=bad)
    with pytest.raises(ValueError, match="truncate_prompt_tokens value .* max_model_len"):
        llm.generate(prompt, SP(truncate_prompt_tokens=257), use_tqdm=False)
    assert_no_leak(llm)


def test_add_request_takes_vllm_prompt_forms_and_arrival_time(llm: LLM) -> None:
    eng = llm.llm_engine
    ids = llm.get_tokenizer().encode("The capital of France is")
    params = SamplingParams(temperature=0, max_tokens=3, output_kind="final_only")
    want = llm.generate("The capital of France is", params, use_tqdm=False)[0]
    forms = {
        "text": {"prompt": "The capital of France is"},
        "tokens": {"prompt_token_ids": ids},
        "list": ids,
    }
    for name, prompt in forms.items():
        eng.add_request(name, prompt, params, 1234.5)  # vLLM: arrival_time 4th
    outs = {}
    while eng.has_unfinished_requests():
        outs.update((o.request_id, o) for o in eng.step())
    for name in forms:
        assert outs[name].prompt_token_ids == ids, name
        assert outs[name].outputs[0].token_ids == want.outputs[0].token_ids, name
        assert outs[name].metrics.arrival_time == 1234.5
    assert outs["text"].prompt == "The capital of France is" and outs["tokens"].prompt is None
    with pytest.raises(ValueError, match="'prompt' or 'prompt_token_ids'"):
        eng.add_request("bad", {"text": "x"}, params)
    assert_no_leak(llm)


@pytest.mark.parametrize("n", [1, 2])
def test_delta_outputs_add_up_to_the_cumulative_ones(llm: LLM, n: int) -> None:
    from pagedkv import RequestOutputKind

    def params(kind) -> SamplingParams:
        return SamplingParams(
            n=n,
            temperature=0.8,
            seed=7,
            max_tokens=12,
            logprobs=1,
            prompt_logprobs=1,
            stop=[" the"],
            output_kind=kind,
        )

    prompt = "Once upon a time"
    cum = _stream(llm, "cum", prompt, params(RequestOutputKind.CUMULATIVE))
    delta = _stream(llm, "delta", prompt, params("delta"))
    assert len(delta) == len(cum) and delta[-1].finished
    assert delta[0].prompt_logprobs == cum[-1].prompt_logprobs
    assert all(o.prompt_logprobs is None for o in delta[1:])
    final = {c.index: c for c in cum[-1].outputs}
    for i in range(n):
        parts = [c for o in delta for c in o.outputs if c.index == i]
        assert "".join(c.text for c in parts) == final[i].text
        assert sum((c.token_ids for c in parts), []) == final[i].token_ids
        assert sum((c.logprobs for c in parts), []) == final[i].logprobs
        assert [c.finish_reason for c in parts][-1] == final[i].finish_reason
        assert all(c.finish_reason is None for c in parts[:-1])
        assert parts[-1].cumulative_logprob == pytest.approx(final[i].cumulative_logprob)
    assert_no_leak(llm)


def test_chat_template_kwargs_reach_the_template(llm: LLM) -> None:
    template = "{{ greeting }}{% for m in messages %}|{{ m['content'] }}{% endfor %}"
    msgs = [{"role": "user", "content": "Hi"}]
    params = SamplingParams(temperature=0, max_tokens=1)
    out = llm.chat(
        msgs,
        params,
        use_tqdm=False,
        chat_template=template,
        chat_template_kwargs={"greeting": "Hello"},
    )[0]
    assert out.prompt == "Hello|Hi"
    assert llm.llm_engine.get_tokenizer() is llm.get_tokenizer()
    assert_no_leak(llm)


def test_allowed_token_ids_restrict_sampling(llm: LLM) -> None:
    prompt = "The capital of France is"
    allowed = [30, 284, 3575]  # ".", " and", " capital": never the unrestricted first token
    free = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=1, logprobs=20), use_tqdm=False
    )[0].outputs[0]
    assert free.token_ids[0] not in allowed
    for params in (
        SamplingParams(temperature=0, max_tokens=6, allowed_token_ids=allowed),
        SamplingParams(temperature=1.0, seed=3, max_tokens=6, allowed_token_ids=allowed),
        SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6, allowed_token_ids=allowed),
    ):
        for c in llm.generate(prompt, params, use_tqdm=False)[0].outputs:
            assert c.token_ids and set(c.token_ids) <= set(allowed), (params, c.token_ids)
    # Greedy picks the most likely allowed token (the raw logprobs rank them).
    first = (
        llm.generate(
            prompt,
            SamplingParams(temperature=0, max_tokens=1, allowed_token_ids=allowed),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids[0]
    )
    ranked = {t: lp.logprob for t, lp in free.logprobs[0].items() if t in allowed}
    assert not ranked or first == max(ranked, key=ranked.__getitem__)
    with pytest.raises(ValueError, match="allowed_token_ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="allowed_token_ids must be in"):
        llm.generate(prompt, SamplingParams(allowed_token_ids=[10**6]), use_tqdm=False)
    assert_no_leak(llm)


def _contains(seq: list, sub: list) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_bad_words_are_never_generated(llm: LLM) -> None:
    from pagedkv.engine.request_state import tokenize_bad_words

    prompt = "The capital of France is"
    greedy = dict(temperature=0, max_tokens=12, ignore_eos=True)
    free = llm.generate(prompt, SamplingParams(**greedy), use_tqdm=False)[0].outputs[0]
    assert "Paris" in free.text and "answer is" in free.text  # " Paris.\n\nThe answer is: ..."
    words = ["Paris", "answer is"]  # one token, and a two-token word (" answer", " is")
    encode = llm.get_tokenizer().encode
    ids = tokenize_bad_words(words, lambda t: encode(t, add_special_tokens=False))
    # Both spellings: at the text's start and after a space (vLLM's rule).
    assert encode(" answer is", add_special_tokens=False) in ids
    assert encode("answer is", add_special_tokens=False) in ids
    assert encode(" Paris", add_special_tokens=False) in ids
    for params in (
        SamplingParams(bad_words=words, **greedy),
        SamplingParams(
            bad_words=words, n=2, temperature=1.0, seed=1, top_k=3, max_tokens=12, ignore_eos=True
        ),
    ):
        for c in llm.generate(prompt, params, use_tqdm=False)[0].outputs:
            assert not any(_contains(c.token_ids, w) for w in ids), (c.text, c.token_ids)
            if params.temperature == 0:
                assert "Paris" not in c.text and "answer is" not in c.text
    with pytest.raises(TypeError, match="bad_words"):
        SamplingParams(bad_words="Paris")
    assert_no_leak(llm)
