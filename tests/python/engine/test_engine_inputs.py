"""Wrong argument types in the Python API raise TypeError / ValueError naming the argument.

(Before, Python's own errors leaked out: "'>=' not supported between instances of 'str' and
'float'", "'int' object is not iterable", a Jinja UndefinedError...)
"""

from __future__ import annotations

import pytest
from support.deps import need
from support.engine import assert_no_leak

need("torch")

from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

BAD_PARAMS = [
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": None}, "top_p"),
    ({"min_p": [0.1]}, "min_p"),
    ({"presence_penalty": "1"}, "presence_penalty"),
    ({"repetition_penalty": True}, "repetition_penalty"),
    ({"n": 2.0}, "n"),
    ({"best_of": "3"}, "best_of"),
    ({"top_k": 1.5}, "top_k"),
    ({"seed": "42"}, "seed"),
    ({"max_tokens": 3.0}, "max_tokens"),
    ({"min_tokens": "1"}, "min_tokens"),
    ({"logprobs": True}, "logprobs"),
    ({"prompt_logprobs": 1.0}, "prompt_logprobs"),
    ({"stop": 5}, "stop"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"stop_token_ids": 5}, "stop_token_ids"),
    ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"detokenize": "yes"}, "detokenize"),
    ({"output_kind": 3}, "output_kind"),
]


@pytest.mark.parametrize("kwargs,name", BAD_PARAMS, ids=[n for _, n in BAD_PARAMS])
def test_sampling_params_wrong_types_name_the_field(kwargs, name):
    got = type(next(iter(kwargs.values()))).__name__
    with pytest.raises(TypeError, match=rf"^{name} must be .*, got {got}"):
        SamplingParams(**kwargs)


def test_sampling_params_accepts_numeric_kinds():
    np = need("numpy")
    p = SamplingParams(
        n=np.int64(2),
        temperature=np.float32(0.5),
        top_p=1,
        seed=np.int32(3),
        stop=("a", "b"),
        stop_token_ids=(np.int64(7),),
        top_k=None,
    )
    assert (p.n, p.best_of, p.seed, p.top_k) == (2, 2, 3, 0)
    assert type(p.n) is int and type(p.temperature) is float and type(p.top_p) is float
    assert p.temperature == 0.5 and p.stop == ["a", "b"] and p.stop_token_ids == [7]
    assert SamplingParams(max_tokens=None, seed=None, best_of=None).max_tokens is None
    with pytest.raises(ValueError, match="temperature"):  # the value rules still apply
        SamplingParams(temperature=float("nan"))


@pytest.fixture(scope="module")
def llm(smollm2_gguf: str):
    need("gguf")
    from pagedkv.engine.llm import LLM

    return LLM(device="cpu", kv_cache_space=0.05, max_model_len=128)


BAD_PROMPTS = [
    (123, TypeError, r"^prompts must be .*got int 123"),
    (None, ValueError, "prompts must be given"),
    ([1, "a"], TypeError, r"^prompts\[0\] must be"),
    (["ok", 5], TypeError, r"^prompts\[1\] must be .*got int 5"),
    ([[1, 2.5]], TypeError, r"^prompts\[0\] must be"),
    ({"text": "hi"}, ValueError, r"^prompts: a prompt dict needs 'prompt' or 'prompt_token_ids'"),
    ({"prompt": 5}, TypeError, r"^prompts\['prompt'\] must be a string"),
    ([{"prompt_token_ids": "12"}], TypeError, r"^prompts\[0\]\['prompt_token_ids'\] must be"),
    ([True, False], TypeError, "prompts"),
]


@pytest.mark.parametrize("prompts,exc,msg", BAD_PROMPTS)
def test_generate_rejects_bad_prompts(llm, prompts, exc, msg):
    with pytest.raises(exc, match=msg):
        llm.generate(prompts, SamplingParams(max_tokens=1), use_tqdm=False)
    assert_no_leak(llm)


def test_generate_rejects_bad_other_arguments(llm):
    p = SamplingParams(max_tokens=1)
    with pytest.raises(TypeError, match=r"^sampling_params must be a SamplingParams"):
        llm.generate("hi", {"temperature": 0}, use_tqdm=False)
    with pytest.raises(TypeError, match=r"^sampling_params\[1\] must be a SamplingParams"):
        llm.generate(["a", "b"], [p, None], use_tqdm=False)
    with pytest.raises(TypeError, match=r"^prompt_token_ids\[0\] must be a list of integer"):
        llm.generate(prompt_token_ids=["abc"], use_tqdm=False)
    with pytest.raises(TypeError, match=r"^prompt_token_ids must be a list of token-id lists"):
        llm.generate(prompt_token_ids=[1, 2, 3], use_tqdm=False)
    with pytest.raises(TypeError, match=r"^priority must be a list of integers"):
        llm.generate(["a", "b"], p, priority=[0, "1"], use_tqdm=False)
    assert_no_leak(llm)
    # The documented forms still work, each giving one output in order.
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello")
    outs = llm.generate(
        ["Hello", ids, {"prompt": "Hello"}, {"prompt_token_ids": tuple(ids)}],
        SamplingParams(temperature=0, max_tokens=3),
        use_tqdm=False,
    )
    assert len({tuple(o.outputs[0].token_ids) for o in outs}) == 1
    assert len(llm.generate(ids, p, use_tqdm=False)) == 1
    # Other iterables and arrays, as lists: a generator of prompts, numpy token ids, range.
    np = need("numpy")
    more = llm.generate(
        (q for q in ["Hello", np.array(ids), {"prompt_token_ids": range(3)}]),
        (q for q in [SamplingParams(temperature=0, max_tokens=3)] * 3),
        use_tqdm=False,
    )
    assert more[1].outputs[0].token_ids == outs[0].outputs[0].token_ids
    assert more[1].prompt_token_ids == ids and more[2].prompt_token_ids == [0, 1, 2]
    assert llm.generate(np.array([ids, ids]), p, use_tqdm=False)[1].prompt_token_ids == ids
    assert llm.generate([], p, use_tqdm=False) == []
    assert_no_leak(llm)


BAD_MESSAGES = [
    ("hi", TypeError, r"^messages must be a list of .*got str 'hi'"),
    ([], ValueError, "messages must not be empty"),
    ([{"content": "hi"}], ValueError, r"^messages\[0\] has no 'role'"),
    ([{"role": "user"}], ValueError, r"^messages\[0\] has no 'content'"),
    ([{"role": "user", "content": 5}], TypeError, r"^messages\[0\]\['content'\] must be a str"),
    ([{"role": None, "content": "x"}], TypeError, r"^messages\[0\]\['role'\] must be a str"),
    (["hi"], TypeError, r"^messages\[0\] must be a dict"),
    ([[{"role": "user", "content": "a"}], "b"], TypeError, r"^messages\[1\] must be a non-emp"),
    (
        [[{"role": "user", "content": "a"}, {"role": "user"}]],
        ValueError,
        r"^messages\[0\]\[1\] has no 'content'",
    ),
]


@pytest.mark.parametrize("messages,exc,msg", BAD_MESSAGES)
def test_chat_rejects_bad_messages(llm, messages, exc, msg):
    with pytest.raises(exc, match=msg):
        llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False)
    assert_no_leak(llm)


def test_chat_accepts_openai_text_parts(llm):
    plain = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there\nfriend"},
    ]
    parts = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello there"},
                {"type": "text", "text": "friend"},
            ],
        },
    ]
    p = SamplingParams(temperature=0, max_tokens=2)
    a, b = llm.chat([plain, parts], p, use_tqdm=False)
    assert a.prompt == b.prompt and "Hello there\nfriend" in a.prompt
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    assert isinstance(parts[1]["content"], list)  # the caller's messages are left alone
    with pytest.raises(ValueError, match=r"^messages\[0\]\['content'\]\[1\]: only text parts"):
        llm.chat(
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "hi"}, {"type": "unknown", "x": "y"}],
                }
            ],
            p,
            use_tqdm=False,
        )
    with pytest.raises(
        ValueError,
        match=r"^messages\[0\]\['content'\]\[1\] \(type "
        r"'image_url'\): image inputs are not supported",
    ):
        llm.chat(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": "x"},
                    ],
                }
            ],
            p,
            use_tqdm=False,
        )
    assert_no_leak(llm)


def test_out_of_vocab_stop_token_ids_are_rejected(llm):
    # vLLM rejects them too (SamplingParams._validate_stop_token_ids, vllm#54196): such an id
    # can never be sampled, and the min_tokens ban indexes the logits with it.
    vocab = llm.llm_engine.model_config.vocab_size
    for bad in ([vocab], [5, vocab + 100], [10**9]):
        p = SamplingParams(max_tokens=2, min_tokens=1, stop_token_ids=bad)
        msg = rf"^stop_token_ids must be in \[0, {vocab}\).*{bad[-1]}"
        with pytest.raises(ValueError, match=msg):
            llm.generate("Hello", p, use_tqdm=False)
        with pytest.raises(ValueError, match=r"^stop_token_ids"):
            llm.chat([{"role": "user", "content": "hi"}], p, use_tqdm=False)
        assert_no_leak(llm)
    # Negative and non-integer ids are SamplingParams' own errors.
    with pytest.raises(ValueError, match=r"^stop_token_ids"):
        SamplingParams(stop_token_ids=[-1])
    with pytest.raises(TypeError, match=r"^stop_token_ids"):
        SamplingParams(stop_token_ids=[1.5])
    # The last id of the vocabulary is a valid stop id.
    out = llm.generate(
        "Hello", SamplingParams(max_tokens=2, stop_token_ids=[vocab - 1]), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) >= 1
    assert_no_leak(llm)


def test_out_of_vocab_logit_bias_is_rejected(llm):
    # The server checks these ids too; through LLM an unchecked one would index the logits
    # inside a step.
    vocab = llm.llm_engine.model_config.vocab_size
    p = SamplingParams(max_tokens=2, logit_bias={5: 1.0, vocab: -3.0})
    with pytest.raises(ValueError, match=rf"^logit_bias must be in \[0, {vocab}\).*{vocab}"):
        llm.generate("Hello", p, use_tqdm=False)
    assert_no_leak(llm)
    out = llm.generate(
        "Hello", SamplingParams(max_tokens=2, logit_bias={vocab - 1: 0.5}), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) >= 1
