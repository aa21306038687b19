"""Structured outputs (xgrammar) and logits processors through the whole engine, on a tiny random
Llama with the SmolLM2 tokenizer: a random model picks arbitrary tokens, so every constraint is
exercised on outputs no real model would write. Answers are checked by independent means:
``jsonschema`` for schemas, Python's ``re`` for regexes, plain membership for choices."""

from __future__ import annotations

import json
import re

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")
need("transformers")
need("xgrammar")
jsonschema = need("jsonschema")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.structured_output import (  # noqa: E402
    GuidedDecodingParams,
    StructuredOutputsParams,
)
from pagedkv.testing import save_random_model  # noqa: E402

PROMPT = "Give me the record as JSON:"
# Bounded output (enums, ranged integers, bounded strings, no free whitespace), so that even a
# random model completes it within max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
        "tag": {"type": "string", "pattern": "^[a-z]{1,6}$"},
    },
    "required": ["color", "count", "ok", "tag"],
}


def _llm(tmp_path_factory, blocks: int) -> LLM:
    out = str(tmp_path_factory.mktemp("tiny_structured"))
    path = save_random_model(
        out,
        "tiny-llama",
        seed=7,
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
        num_gpu_blocks_override=blocks,
        max_model_len=256,
        seed=0,
    )


@pytest.fixture(scope="module")
def llm(tmp_path_factory, smollm2_gguf: str) -> LLM:
    return _llm(tmp_path_factory, 256)


def _so(**kw) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kw)


def _params(so: StructuredOutputsParams, **kw) -> SamplingParams:
    base = {"temperature": 1.0, "max_tokens": 80, "seed": 11}
    return SamplingParams(structured_outputs=so, **{**base, **kw})


def test_json_schema_every_sample_validates(llm: LLM) -> None:
    so = _so(json=SCHEMA, disable_any_whitespace=True)
    outs = llm.generate([PROMPT, "Another one:"], _params(so, n=4), use_tqdm=False)
    for req in outs:
        assert len(req.outputs) == 4
        for o in req.outputs:
            assert o.finish_reason == "stop", o.text
            jsonschema.validate(json.loads(o.text), SCHEMA)
    assert len({o.text for req in outs for o in req.outputs}) > 1  # samples differ
    assert_no_leak(llm)


def test_regex_choice_grammar(llm: LLM) -> None:
    pattern = r"[a-c]{2,5}@(x|yz)\.[0-9]{1,3}"
    regex = llm.generate([PROMPT] * 3, _params(_so(regex=pattern)), use_tqdm=False)
    for r in regex:
        assert re.fullmatch(pattern, r.outputs[0].text), r.outputs[0].text
    choices = ["yes", "no", 'say "maybe"', "naïve\n"]
    picked = llm.generate([PROMPT] * 4, _params(_so(choice=choices), n=3), use_tqdm=False)
    assert all(o.text in choices for r in picked for o in r.outputs)
    ebnf = 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9] [0-9]?'
    gram = llm.generate(PROMPT, _params(_so(grammar=ebnf)), use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?)*\)", gram.text), gram.text
    assert_no_leak(llm)


def test_guided_decoding_spelling_and_greedy(llm: LLM) -> None:
    old = SamplingParams(
        temperature=0, max_tokens=40, guided_decoding=GuidedDecodingParams(choice=["alpha", "beta"])
    )
    assert old.structured_outputs == StructuredOutputsParams(choice=["alpha", "beta"])
    assert old.guided_decoding is None
    out = llm.generate(PROMPT, old, use_tqdm=False)[0].outputs[0]
    assert out.text in ("alpha", "beta") and out.finish_reason == "stop"


def test_json_object_output_is_a_json_object_or_cut_by_length(llm: LLM) -> None:
    outs = llm.generate([PROMPT] * 3, _params(_so(json_object=True), max_tokens=60), use_tqdm=False)
    for r in outs:
        o = r.outputs[0]
        assert o.text.lstrip().startswith("{")
        if o.finish_reason == "stop":
            assert isinstance(json.loads(o.text), dict)


def test_unconstrained_outputs_unchanged_in_a_mixed_batch(llm: LLM) -> None:
    plain = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = llm.generate(PROMPT, plain, use_tqdm=False)[0].outputs[0].token_ids
    mixed = llm.generate([PROMPT, PROMPT], [plain, _params(_so(regex="[0-9]{4}"))], use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone
    assert re.fullmatch("[0-9]{4}", mixed[1].outputs[0].text)


def test_grammar_end_finishes_even_with_ignore_eos(llm: LLM) -> None:
    out = llm.generate(PROMPT, _params(_so(choice=["done"]), ignore_eos=True), use_tqdm=False)[
        0
    ].outputs[0]
    assert (out.text, out.finish_reason) == ("done", "stop")
    assert_no_leak(llm)


def test_stop_string_and_max_tokens_under_a_constraint(llm: LLM) -> None:
    out = llm.generate(
        PROMPT, _params(_so(regex="ab(cd){3}e"), max_tokens=60, stop=["cdcd"]), use_tqdm=False
    )[0].outputs[0]
    assert (out.text, out.finish_reason, out.stop_reason) == ("ab", "stop", "cdcd")
    cut = llm.generate(PROMPT, _params(_so(regex="[0-9]{30}"), max_tokens=3), use_tqdm=False)[
        0
    ].outputs[0]
    assert cut.finish_reason == "length" and re.fullmatch("[0-9]*", cut.text)
    assert_no_leak(llm)


def test_refused_spec_fails_only_that_request(llm: LLM) -> None:
    with pytest.raises(ValueError, match="structured_outputs"):
        llm.generate(PROMPT, _params(_so(regex="(unclosed")), use_tqdm=False)
    with pytest.raises(ValueError, match="structured_outputs"):
        llm.generate(PROMPT, _params(_so(json="{not json")), use_tqdm=False)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="backend"):
        GuidedDecodingParams(regex="a", backend="outlines")
    assert_no_leak(llm)
    ok = llm.generate(PROMPT, _params(_so(choice=["x"])), use_tqdm=False)[0].outputs[0]
    assert ok.text == "x"


def test_logits_processors(llm: LLM) -> None:
    forced = llm.llm_engine.tokenizer.encode("hello", add_special_tokens=False)[0]
    seen: list[int] = []

    def force(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        seen.append(len(output_ids))
        logits[:] = float("-inf")
        logits[forced] = 0.0
        return logits

    def ban_forced(
        prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor
    ) -> torch.Tensor:
        assert prompt_ids
        out = logits.clone()
        out[forced] = float("-inf")
        return out

    p = SamplingParams(temperature=0.7, max_tokens=5, ignore_eos=True, logits_processors=[force])
    assert p.clone().logits_processors[0] is force  # shared, not deep-copied
    out = llm.generate(PROMPT, p, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [forced] * 5 and seen == [0, 1, 2, 3, 4]
    banned = llm.generate(
        PROMPT,
        SamplingParams(
            temperature=0, max_tokens=8, ignore_eos=True, logits_processors=[ban_forced]
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert forced not in banned.token_ids
    with pytest.raises(TypeError, match="logits_processors"):
        SamplingParams(logits_processors=[3])


def test_preemption_under_constraints(tmp_path_factory, smollm2_gguf: str) -> None:
    small = _llm(tmp_path_factory, 24)  # 24 blocks of 8: the batch cannot all stay resident
    so = _so(json=SCHEMA, disable_any_whitespace=True)
    outs = small.generate([f"{PROMPT} {i}" for i in range(6)], _params(so, n=4), use_tqdm=False)
    assert small.llm_engine.scheduler.num_preemptions > 0
    for r in outs:
        for o in r.outputs:
            assert o.finish_reason == "stop", o.text
            jsonschema.validate(json.loads(o.text), SCHEMA)
    assert_no_leak(small)
