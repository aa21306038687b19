"""Tokenizer wrapper vs HF's own tokenizer built from the GGUF; incremental detokenizer vs a
full decode over random token streams; stop-string helpers vs brute force."""

from __future__ import annotations

import os
import random

import pytest
from support.deps import need

transformers = need("transformers")

from pagedkv.engine.detokenizer import (  # noqa: E402
    IncrementalDetokenizer,
    find_stop_string,
    stop_holdback,
    truncate_at_stop,
)
from pagedkv.engine.tokenizer import Tokenizer  # noqa: E402

TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\n\nnew lines ",
    "Unicode: naïve café — 東京 😀👍🏽 Ελληνικά",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
    "def f(x):\n    return x ** 2  # code",
    "",
]


@pytest.fixture(scope="module")
def gguf_path(smollm2_gguf: str) -> str:
    return smollm2_gguf


@pytest.fixture(scope="module")
def hf_tok(gguf_path: str):
    return transformers.AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )


@pytest.fixture(scope="module")
def tok(gguf_path: str, tmp_path_factory) -> Tokenizer:
    # A fresh cache folder: the first load converts the GGUF vocabulary, the second reads the
    # cached tokenizer.json; the test uses the cached one.
    os.environ["PAGEDKV_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    try:
        Tokenizer.from_pretrained(gguf_path)
        return Tokenizer.from_pretrained(gguf_path)
    finally:
        del os.environ["PAGEDKV_CACHE_DIR"]


def test_encode_decode_match_hf(tok: Tokenizer, hf_tok) -> None:
    for text in TEXTS:
        ids = tok.encode(text)
        assert ids == hf_tok.encode(text)
        assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids)
    assert tok.vocab_size == len(hf_tok) == 49152
    assert (tok.eos_token_id, tok.bos_token_id) == (hf_tok.eos_token_id, hf_tok.bos_token_id)
    assert tok.decode(tok.encode(TEXTS[2])) == TEXTS[2]


def test_chat_template_matches_hf(tok: Tokenizer, hf_tok) -> None:
    conv1 = [{"role": "user", "content": "What is 2+2?"}]
    conv2 = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a fruit."},
    ]
    for conv in (conv1, conv2):
        for gen in (True, False):
            expected = hf_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(conv, add_generation_prompt=gen) == expected
    text = tok.apply_chat_template(conv1)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert tok.apply_chat_template([conv1, conv2]) == [text, tok.apply_chat_template(conv2)]
    assert tok.apply_chat_template(conv1, tokenize=True) == hf_tok.encode(
        text, add_special_tokens=False
    )
    custom = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    assert tok.apply_chat_template(conv2, chat_template=custom) == (
        "[system] Be brief.\n[user] Hi\n[assistant] Hello!\n[user] Name a fruit.\n"
    )


def _stream(tok: Tokenizer, ids: list[int], rng: random.Random, skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    deltas, i = [], 0
    while i < len(ids):
        n = rng.choice([1, 1, 1, 2, 3])
        deltas.append(detok.append(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.output_text
    return deltas


def test_incremental_detokenizer_equals_full_decode(tok: Tokenizer) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    # Real text: valid UTF-8 throughout, so no delta may carry a broken character.
    for text in TEXTS:
        ids = tok.encode(text)
        for skip in (True, False):
            deltas = _stream(tok, ids, rng, skip)
            assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), seed
            assert not any("\ufffd" in d for d in deltas), (seed, deltas)
    # Random ids, biased towards the byte tokens that hold pieces of multi-byte characters.
    byte_ids = [
        i for i in range(tok.vocab_size) if "\ufffd" in tok.decode([i], skip_special_tokens=False)
    ]
    assert byte_ids, "expected byte-fallback tokens for partial UTF-8"
    for _ in range(200):
        n = rng.randint(1, 24)
        ids = [
            rng.choice(byte_ids) if rng.random() < 0.4 else rng.randrange(tok.vocab_size)
            for _ in range(n)
        ]
        skip = rng.random() < 0.5
        deltas = _stream(tok, ids, rng, skip)
        assert "".join(deltas) == tok.decode(ids, skip_special_tokens=skip), (seed, ids)


def test_multibyte_character_waits_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # one emoji, several byte-level tokens
    detok = IncrementalDetokenizer(tok)
    assert [detok.append([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.append(ids[-1:]) == "😀"


def _brute_stop(text: str, new_chars: int, stop: list[str], include: bool):
    best = None
    for s in stop:
        for i in range(len(text) - len(s) + 1):
            # must end inside the new part of the text
            if text[i : i + len(s)] == s and s and i + len(s) > len(text) - new_chars:
                if best is None or i < best[1]:
                    best = (s, i)
                break
    return None if best is None else (best[0], best[1] + (len(best[0]) if include else 0))


def test_stop_string_helpers_match_brute_force() -> None:
    rng = random.Random(random.randrange(2**32))
    for _ in range(500):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 12)))
        new = rng.randint(0, len(text))
        stop = [
            "".join(rng.choice("abc") for _ in range(rng.randint(1, 3)))
            for _ in range(rng.randint(1, 3))
        ]
        include = rng.random() < 0.5
        got = find_stop_string(text, new, stop, include)
        # A stop found earlier than the new part would have been caught at an earlier step,
        # so only compare when the text before the new part has no stop at all.
        if any(s in text[: len(text) - new] for s in stop):
            continue
        assert got == _brute_stop(text, new, stop, include), (text, new, stop)
        hold = stop_holdback(text, stop)
        assert hold == max(
            [n for s in stop for n in range(len(s)) if n <= len(text) and text.endswith(s[:n])],
            default=0,
        )
    assert truncate_at_stop("Hello world. Bye", 16, [". B", "wor"]) == ("Hello ", "wor")
    assert truncate_at_stop("Hello", 5, ["x"]) == ("Hello", None)


def _wordpiece() -> Tokenizer:
    """A tiny WordPiece tokenizer: its decoder joins tokens with spaces, special ones too
    ("[CLS] [SEP] hellos"), which is what spaces_between_special_tokens=False removes."""
    tokenizers = need("tokenizers")
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "##s": 5}
    rust = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
    rust.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    rust.decoder = tokenizers.decoders.WordPiece()
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=rust, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )
    return Tokenizer(hf)


@pytest.mark.parametrize("spaces", [True, False])
def test_spaces_between_special_tokens(spaces: bool) -> None:
    # vLLM (FastIncrementalDetokenizer): False emits an added token that follows another
    # added token as its bare content; True keeps the decoder's output; skipped specials are
    # gone either way. Same through Tokenizer.decode, the engine's DirectDecoder and the
    # incremental detokenizer.
    from pagedkv.engine.direct_decoder import DirectDecoder

    tok = _wordpiece()
    ids = [1, 2, 3, 5, 4, 2, 1, 2]
    want = (
        "[CLS] [SEP] hellos world [SEP] [CLS] [SEP]"
        if spaces
        else "[CLS][SEP] hellos world [SEP][CLS][SEP]"
    )
    assert tok.decode(ids, False, spaces) == want
    direct = DirectDecoder(tok)
    assert direct.decode(ids, False, spaces) == want
    assert direct.decode(ids, True, spaces) == "hellos world"
    for decoder in (tok, direct):
        detok = IncrementalDetokenizer(decoder, False, spaces)
        text = "".join(detok.append([t]) for t in ids) + detok.flush()
        assert text == want, decoder


def test_tokenizer_offers_the_hf_api_vllm_code_uses(tok: Tokenizer, hf_tok) -> None:
    # LLM.get_tokenizer() returns this wrapper; vLLM returns the HF tokenizer, so code written
    # for vLLM calls HF's API on it.
    text = "Hello, world!"
    assert tok(text).input_ids == hf_tok(text).input_ids
    assert tok.convert_tokens_to_ids("<|im_end|>") == hf_tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.batch_decode([[1, 2], [28120]]) == hf_tok.batch_decode([[1, 2], [28120]])
    assert tok.eos_token == hf_tok.eos_token and tok.get_vocab() == hf_tok.get_vocab()
    with pytest.raises(AttributeError):
        tok.no_such_attribute  # noqa: B018
