"""Draft-model speculation as a vLLM user meets it (tiny random Llamas with the SmolLM2
tokenizer on the CPU; the draft is the target cut to its first layer, so drafts are both
accepted and rejected): stop strings (excluded and included), logprobs and prompt_logprobs
equal plain decoding's; seeded n=2 / best_of repeat exactly; a request aborted mid-run on the
LLMEngine frees its blocks (the target's and the draft's share block ids)."""

from __future__ import annotations

from typing import Any, List

import pytest
from support.deps import need
from support.engine import assert_no_leak
from support.speculation import save_cpu_target, save_first_layers

need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["Hello world, this is", "The quick brown fox", "a b c d e f g h i j k", "Once"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: Any) -> tuple:
    target = save_cpu_target(
        str(tmp_path_factory.mktemp("spec_target")), tokenizer=True, max_position_embeddings=512
    )
    draft = save_first_layers(target, str(tmp_path_factory.mktemp("spec_draft")), 1)
    args = dict(device="cpu", kv_cache_space=0.02, max_model_len=128, block_size=4)
    plain = LLM(target, **args)
    spec = LLM(target, speculative_config={"model": draft, "num_speculative_tokens": 3}, **args)
    return plain, spec


def _view(outs: List[Any]) -> list:
    def lps(c: Any) -> Any:
        if c.logprobs is None:
            return None
        return [sorted((t, round(lp.logprob, 4)) for t, lp in d.items()) for d in c.logprobs]

    return [
        [(list(c.token_ids), c.text, c.finish_reason, c.stop_reason, lps(c)) for c in o.outputs]
        for o in outs
    ]


def test_stop_strings_and_logprobs_equal_plain_decoding(models: tuple) -> None:
    plain, spec = models
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    texts = [o.outputs[0].text for o in plain.generate(PROMPTS, greedy, use_tqdm=False)]
    stop = texts[0][5:9]  # ends the first prompt's output inside a step's drafts
    cases = [
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop]),
        SamplingParams(
            temperature=0,
            max_tokens=20,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, logprobs=0),
    ]
    for params in cases:
        want = _view(plain.generate(PROMPTS, params, use_tqdm=False))
        assert _view(spec.generate(PROMPTS, params, use_tqdm=False)) == want, params
        assert_no_leak(spec)
        if params.stop:
            assert want[0][0][3] == stop  # the stop string did end an output
    stats = spec.llm_engine.get_stats()
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]

    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, prompt_logprobs=2)

    def prompt_lps(llm: LLM) -> list:
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        return [
            [None if d is None else sorted((t, round(v.logprob, 4)) for t, v in d.items())]
            for o in outs
            for d in o.prompt_logprobs
        ]

    assert prompt_lps(spec) == prompt_lps(plain)


def test_seeded_samples_repeat(models: tuple) -> None:
    _, spec = models
    for params in (
        SamplingParams(n=2, temperature=0.8, seed=7, max_tokens=15, ignore_eos=True),
        SamplingParams(n=2, best_of=4, temperature=0.8, seed=7, max_tokens=15, ignore_eos=True),
    ):
        first = _view(spec.generate(PROMPTS, params, use_tqdm=False))
        assert _view(spec.generate(PROMPTS, params, use_tqdm=False)) == first
        assert all(len(o) == 2 for o in first)
        assert_no_leak(spec)


def test_abort_mid_run_frees_every_block(models: tuple) -> None:
    _, spec = models
    eng = spec.llm_engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        eng.add_request(f"abort{i}", prompt, params)
    for _ in range(4):
        eng.step()
    eng.abort_request(["abort0", "abort2"])
    finished = set()
    while eng.has_unfinished_requests():
        finished |= {o.request_id for o in eng.step() if o.finished}
    assert finished == {"abort1", "abort3"}
    assert_no_leak(spec)
