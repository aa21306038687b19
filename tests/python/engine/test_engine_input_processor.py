"""The InputProcessor and the value rules under it, without a model: every field to a range the
engine can run (ints within int64, floats within float32), lists within the limits, request
ids printable, and vLLM's engine arguments honoured or refused by name with the reason."""

from __future__ import annotations

from typing import List

import pytest
from support.deps import need

need("torch")  # EngineConfig resolves torch dtypes

from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.engine.input_processor import (  # noqa: E402
    EngineRequest,
    InputProcessor,
    RequestLimits,
    check_request_id,
)
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402
from pagedkv.engine.vllm_args import VLLM_ONLY_ARGS  # noqa: E402


class _CharTokenizer:
    """One token per character (its code point modulo 100), no special tokens."""

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        text.encode("utf-8")  # raises on a lone surrogate, as a real tokenizer would
        return [ord(c) % 100 for c in text]


def processor(**limits: int) -> InputProcessor:
    return InputProcessor(
        _CharTokenizer(),
        vocab_size=100,
        max_model_len=32,
        max_logprobs=5,
        limits=RequestLimits(**limits) if limits else None,
    )


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("top_k", 2**64, "int64"),
        ("n", 2**63, "int64"),
        ("min_tokens", -(2**63) - 1, "int64"),
        ("temperature", 1e39, "float32"),
        ("temperature", float("inf"), "finite"),
        ("repetition_penalty", 1e-46, "float32"),
        ("repetition_penalty", 1e-7, "finite"),
        ("repetition_penalty", 1e7, "finite"),
        ("top_p", 1e-46, "float32"),
        ("min_p", float("nan"), "finite"),
    ],
)
def test_values_outside_the_samplers_range_are_refused_by_name(field, value, words):
    with pytest.raises(ValueError, match=rf"^{field} ") as err:
        SamplingParams(**{field: value})
    assert words in str(err.value)


def test_logit_bias_values_keep_logits_finite():
    SamplingParams(logit_bias={1: -1e10, 2: 1e10})
    with pytest.raises(ValueError, match="^logit_bias values must be in"):
        SamplingParams(logit_bias={1: 1e11})


def test_a_valid_request_becomes_an_engine_request():
    req = processor().process("r1", "hello", SamplingParams(max_tokens=100, bad_words=["ab"]))
    assert isinstance(req, EngineRequest)
    assert req.prompt_token_ids == [ord(c) % 100 for c in "hello"]
    assert req.max_tokens == 32 - 5  # clamped to what the context leaves
    assert [ord("a") % 100, ord("b") % 100] in req.bad_words_token_ids


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(stop=["a", "b", "c"]), "stop"),
        (SamplingParams(stop=["abcdef"]), "stop"),
        (SamplingParams(bad_words=["a", "b", "c"]), "bad_words"),
        (SamplingParams(bad_words=["abcdef"]), "bad_words"),
        (SamplingParams(logit_bias={1: 1.0, 2: 1.0, 3: 1.0}), "logit_bias"),
        (SamplingParams(n=3, temperature=1.0), "n"),
        (SamplingParams(n=1, best_of=3, temperature=1.0), "best_of"),
    ],
)
def test_limits_refuse_by_field(params, field):
    limited = processor(
        max_stop_strings=2, max_bad_words=2, max_word_chars=5, max_logit_bias=2, max_n_sequences=2
    )
    with pytest.raises(ValueError, match=rf"^{field} "):
        limited.process("r", "hi", params)
    processor().process("r", "hi", params)  # no limit by default (as vLLM's LLM)


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(stop_token_ids=[100]), "stop_token_ids"),
        (SamplingParams(allowed_token_ids=[1] * 101), "allowed_token_ids"),
        (SamplingParams(logit_bias={2**70: 1.0}), "logit_bias"),
        (SamplingParams(logprobs=6), "Requested sample logprobs"),
    ],
)
def test_model_dependent_checks(params, field):
    with pytest.raises(ValueError, match=rf"^{field} "):
        processor().process("r", "hi", params)


def test_min_tokens_past_the_context_is_clamped_to_it():
    req = processor().process("r", "hello", SamplingParams(max_tokens=None, min_tokens=2**40))
    assert req.max_tokens == 27 and req.params.min_tokens == 27


def test_prompts_and_bad_words_must_be_valid_unicode():
    with pytest.raises(ValueError, match="^prompt is not valid Unicode"):
        processor().process("r", "a\ud800b")
    with pytest.raises(ValueError, match="^bad_words is not valid Unicode"):
        processor().process("r", "ok", SamplingParams(bad_words=["\udc00"]))


@pytest.mark.parametrize("rid", ["a\r\nb", "x\n", "\x00", "", "é", "x" * 513])
def test_request_ids_with_control_characters_are_refused(rid):
    with pytest.raises(ValueError, match="^request_id must be 1 to 512 printable ASCII"):
        check_request_id(rid)
    with pytest.raises(ValueError, match="^request_id "):
        processor().process(rid, "hi")
    assert check_request_id("cmpl-42 retry:1/2") == "cmpl-42 retry:1/2"


def test_vllm_engine_arguments_are_honoured_or_refused_with_the_reason():
    # At vLLM's defaults they change nothing and are accepted, so vLLM scripts run unchanged.
    EngineConfig.from_kwargs(
        load_format="auto",
        tokenizer_mode="auto",
        enable_sleep_mode=False,
        compilation_config=None,
        logits_processors=None,
        seed=3,
    )
    for name, value, reason in (
        ("load_format", "dummy", "own loader"),
        ("enable_sleep_mode", True, "sleep mode"),
        ("compilation_config", {"level": 3}, "torch.compile"),
        ("logits_processors", [print], "logits processors"),
        ("tokenizer_mode", "mistral", "fast tokenizer"),
        ("fully_sharded_loras", True, "tensor-parallel ranks"),
        ("code_revision", "v2", "checkpoint's code"),
    ):
        with pytest.raises(ValueError, match=rf"^{name}=.* is not supported: .*{reason}"):
            EngineConfig.from_kwargs(**{name: value})
    assert all(rule.reason for rule in VLLM_ONLY_ARGS.values())


def test_an_argument_is_either_honoured_or_refused_never_both():
    """An EngineConfig field (honoured) must leave the refusal table when it lands."""
    import dataclasses

    honoured = {f.name for f in dataclasses.fields(EngineConfig)}
    assert not honoured & set(VLLM_ONLY_ARGS), sorted(honoured & set(VLLM_ONLY_ARGS))


def test_vllm_engine_flags_are_refused_on_the_command_line(capsys):
    from pagedkv.entrypoints.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["serve", "--load-format", "auto", "--compilation-config", "{}"])
    assert not hasattr(args, "load_format")  # harmless: accepted, nothing to store
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--enable-sleep-mode"])
    assert "enable_sleep_mode=True is not supported: sleep mode" in capsys.readouterr().err
