"""LLM.beam_search against HF transformers' beam search on a tiny random Llama (float32, CPU).

HF ``generate(num_beams=k, do_sample=False, length_penalty=lp, num_return_sequences=k)`` is the
reference: the same hypotheses in the same order, and HF's sequence scores equal to
cum_logprob / num_generated ** lp. Once with EOS disabled (every hypothesis runs to
max_tokens) and once with EOS set to a token the beams often pick (hypotheses end early, and
the search may stop before max_tokens on HF's heuristic). Afterwards no request or KV block is
left, and the beams' shared prefixes came from the prefix cache.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest
from support.beam_reference import hf_beams
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")
need("transformers")

from pagedkv import LLM, BeamSearchParams  # noqa: E402
from pagedkv.engine.beam_search import beam_score  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 512
MAX_TOKENS = 8
BLOCK = 8
ENGINE = dict(
    device="cpu",
    dtype="float32",
    skip_tokenizer_init=True,
    block_size=BLOCK,
    max_model_len=128,
    num_gpu_blocks_override=96,
)
CASES = [(2, 1.0), (2, 0.5), (4, 1.0), (4, 0.5)]  # (beam_width, length_penalty)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (5, 11, 19)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: Any) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("beam") / "m"),
        "tiny-llama",
        seed=3,
        tokenizer=False,
        vocab_size=VOCAB,
        head_dim=32,
    )


@pytest.fixture(scope="module")
def llm(model: str) -> Any:
    return LLM(model, **ENGINE)


def _with_eos(model: str, eos: list[int]) -> str:
    """The same weights with ``eos`` as the end-of-sequence tokens (config.json's, which both
    HF and the engine read)."""
    path = model + "-eos" + "-".join(map(str, eos))
    if not os.path.isdir(path):
        shutil.copytree(model, path)
        cfg_path = os.path.join(path, "config.json")
        with open(cfg_path) as f:
            cfg = json.load(f)
        cfg.update(eos_token_id=eos, pad_token_id=0)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
    return path


def _check_against_hf(llm: Any, path: str, width: int, lp: float, eos: bool) -> list[str]:
    prompts = _prompts()
    params = BeamSearchParams(
        beam_width=width, max_tokens=MAX_TOKENS, ignore_eos=not eos, length_penalty=lp
    )
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    assert_no_leak(llm)
    reasons = []
    for i, (prompt, out) in enumerate(zip(prompts, outs)):
        expected = hf_beams(path, prompt, width, lp, eos, MAX_TOKENS)
        assert len(out.sequences) == width
        for j, (seq, (ref_tokens, ref_score)) in enumerate(zip(out.sequences, expected)):
            assert seq.tokens[: len(prompt)] == prompt
            got = seq.tokens[len(prompt) :]
            assert got == ref_tokens, f"prompt {i}, beam {j}: {got} != HF {ref_tokens}"
            score = beam_score(seq.cum_logprob, len(got), lp)
            assert score == pytest.approx(ref_score, abs=1e-4), f"prompt {i}, beam {j}"
            # cum_logprob is the sum of the chosen tokens' logprobs.
            chosen = sum(step[t].logprob for step, t in zip(seq.logprobs, got))
            assert seq.cum_logprob == pytest.approx(chosen, abs=1e-9)
            if eos and got[-1] in llm.llm_engine.eos_token_ids:
                assert seq.finish_reason == "stop"
            else:
                assert (seq.finish_reason, len(got)) == ("length", MAX_TOKENS)
            reasons.append(seq.finish_reason)
    return reasons


@pytest.mark.parametrize("width, lp", CASES)
def test_beam_search_equals_hf_without_eos(llm: Any, model: str, width: int, lp: float) -> None:
    reasons = _check_against_hf(llm, model, width, lp, eos=False)
    assert set(reasons) == {"length"}


@pytest.fixture(scope="module")
def eos_llm(llm: Any, model: str) -> tuple[Any, str]:
    """An engine with two EOS tokens (HF then keeps 3 x beam_width candidates a step), taken
    from the best no-EOS hypotheses of two prompts (the 1st token of one, the 2nd of another):
    hypotheses then end early (tested below, so that the case is not vacuous)."""
    outs = llm.beam_search(
        [{"prompt_token_ids": p} for p in _prompts()],
        BeamSearchParams(beam_width=2, max_tokens=MAX_TOKENS, ignore_eos=True),
    )
    best = [o.sequences[0].generated_token_ids for o in outs]
    path = _with_eos(model, [best[0][0], best[2][1]])
    return LLM(path, **ENGINE), path


@pytest.mark.parametrize("width, lp", CASES)
def test_beam_search_equals_hf_with_eos(
    llm: Any, eos_llm: tuple[Any, str], width: int, lp: float
) -> None:
    engine, path = eos_llm
    reasons = _check_against_hf(engine, path, width, lp, eos=True)
    # Not vacuous: with lp < 1 short EOS hypotheses win; with lp = 1 they lose to the long
    # ones, but the EOS candidates they took from the running beams changed the search.
    if lp < 1.0:
        assert "stop" in reasons, "no hypothesis ended on EOS"
    else:
        params = BeamSearchParams(width, MAX_TOKENS, ignore_eos=True, length_penalty=lp)
        prompts = [{"prompt_token_ids": p} for p in _prompts()]
        plain = [[s.tokens for s in o.sequences] for o in llm.beam_search(prompts, params)]
        with_eos = [[s.tokens for s in o.sequences] for o in engine.beam_search(prompts, params)]
        assert plain == with_eos  # same weights: ignore_eos makes the engines agree
        params.ignore_eos = False
        ended = [[s.tokens for s in o.sequences] for o in engine.beam_search(prompts, params)]
        assert ended != plain, "EOS changed no hypothesis"


def test_beams_share_their_prefix_blocks(llm: Any) -> None:
    """Every beam request after the first step finds at least its prompt's full blocks in the
    prefix cache (the allocator's shared blocks), instead of computing them again."""
    prompt = _prompts()[2]  # 19 tokens: 2 full blocks of 8
    stats = llm.llm_engine.get_stats
    before = stats()["prefix_cache_hits"]
    width = 4
    llm.beam_search([{"prompt_token_ids": prompt}], BeamSearchParams(width, MAX_TOKENS, True))
    hits = stats()["prefix_cache_hits"] - before
    # Steps 2..MAX_TOKENS each run `width` beams; each has its generated tokens too.
    full = len(prompt) // BLOCK * BLOCK
    assert hits >= (MAX_TOKENS - 1) * width * full, hits
    assert_no_leak(llm)


def test_bad_params_are_refused_by_name(llm: Any) -> None:
    with pytest.raises(ValueError, match="temperature"):
        BeamSearchParams(2, 4, temperature=0.7)
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(0, 4)
    with pytest.raises(TypeError, match="max_tokens"):
        BeamSearchParams(2, 4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beam_width=11 .*max_logprobs=20"):
        llm.beam_search([[5, 6, 7]], BeamSearchParams(11, 4, ignore_eos=True))
    with pytest.raises(TypeError, match="BeamSearchParams"):
        llm.beam_search([[5, 6, 7]], {"beam_width": 2})
    assert_no_leak(llm)


def test_the_context_ends_hypotheses_as_in_generate(llm: Any) -> None:
    """A prompt 3 tokens short of max_model_len: hypotheses of 3 tokens, finished by length,
    the same as asking for 3 tokens."""
    g = torch.Generator().manual_seed(1)
    prompt = {"prompt_token_ids": torch.randint(3, VOCAB, (125,), generator=g).tolist()}
    (out,) = llm.beam_search([prompt], BeamSearchParams(2, MAX_TOKENS, ignore_eos=True))
    (short,) = llm.beam_search([prompt], BeamSearchParams(2, 3, ignore_eos=True))
    assert [len(s.generated_token_ids) for s in out.sequences] == [3, 3]
    assert [s.tokens for s in out.sequences] == [s.tokens for s in short.sequences]
    assert {s.finish_reason for s in out.sequences} == {"length"}
    assert_no_leak(llm)


def test_concurrency_limit_batches_the_prompts_alike(llm: Any) -> None:
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    params = BeamSearchParams(2, 4, ignore_eos=True)
    together = llm.beam_search(prompts, params)
    one_by_one = llm.beam_search(prompts, params, concurrency_limit=1)
    assert [[s.tokens for s in o.sequences] for o in together] == [
        [s.tokens for s in o.sequences] for o in one_by_one
    ]
    with pytest.raises(ValueError, match="concurrency_limit"):
        llm.beam_search(prompts, params, concurrency_limit=0)
    assert_no_leak(llm)
