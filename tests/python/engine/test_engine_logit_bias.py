"""SamplingParams.logit_bias (vLLM's {token id: bias}): validated at construction, added to the
logits before sampling (greedy and random rows, not the reported logprobs), and it takes the
engine off its plain-argmax fast path."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.engine.sampler import Sampler, SamplingRow  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402


def test_logit_bias_validation() -> None:
    assert SamplingParams().logit_bias is None
    assert SamplingParams(logit_bias={3: 1}).logit_bias == {3: 1.0}
    for bad in ({"3": 1.0}, {3: "x"}, {True: 1.0}, [(3, 1.0)], {3: None}):
        with pytest.raises(TypeError, match="logit_bias"):
            SamplingParams(logit_bias=bad)
    for bad in ({-1: 1.0}, {3: float("inf")}, {3: float("nan")}):
        with pytest.raises(ValueError, match="logit_bias"):
            SamplingParams(logit_bias=bad)


def test_sampler_applies_logit_bias() -> None:
    logits = torch.randn(4, 50)
    top = logits.argmax(-1).tolist()
    sampler = Sampler(torch.device("cpu"))
    rows = [
        SamplingRow(SamplingParams(temperature=0, logprobs=1, logit_bias={top[0]: -100.0}), [], []),
        SamplingRow(SamplingParams(temperature=0, logit_bias={7: 100.0}), [], []),
        SamplingRow(SamplingParams(temperature=1.0, logit_bias={11: 100.0}), [], []),
        SamplingRow(SamplingParams(temperature=0), [], []),
    ]  # no bias: untouched
    out = sampler(logits, rows)
    assert out.token_ids[0] == logits[0].topk(2).indices[1].item()
    assert out.token_ids[1:] == [7, 11, top[3]]
    # Logprobs stay those of the raw logits (vLLM's default), whatever the bias.
    assert out.logprobs[0] is not None
    raw = logits[0].log_softmax(-1)
    assert abs(out.logprobs[0][out.token_ids[0]].logprob - raw[out.token_ids[0]].item()) < 1e-5
    # A bias cannot lift a token banned before min_tokens.
    banned = sampler(
        logits[:1],
        [
            SamplingRow(
                SamplingParams(temperature=0, logit_bias={7: 100.0}), [], [], banned_token_ids=[7]
            )
        ],
    )
    assert banned.token_ids[0] != 7


def test_engine_greedy_with_logit_bias(smollm2_gguf: str) -> None:
    from pagedkv import LLM

    llm = LLM(device="cpu", kv_cache_space=0.05, max_model_len=128)
    prompt = "The capital of France is"

    def run(**kw) -> list:
        params = SamplingParams(temperature=0, max_tokens=3, **kw)
        return list(llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids)

    base = run()
    assert run(logit_bias={base[0]: -100})[0] != base[0]
    forced = 1000 if base[0] != 1000 else 1001
    assert run(logit_bias={forced: 100}) == [forced] * 3
