"""An adapter whose folder is deleted after it was added, once the host cache has evicted it and
no device slot holds it, cannot be read again when a step needs it: that fails its requests
alone (issue #25), not the whole step. The others (without an adapter, or with a readable one)
give what they give alone, and the engine serves on. Serial and overlapped loops."""

from __future__ import annotations

import shutil

import pytest
from support.deps import need
from support.engine import assert_no_leak
from support.peft_adapters import save_peft_adapter

need("torch")
need("peft")
need("transformers")

from pagedkv import LLM, LoRARequest, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

PROMPTS = [[5, 9, 17, 33, 65, 129], [7, 11, 13, 19, 23], [40, 41, 42, 43]]
SP = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, detokenize=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("robust_lora")
    return save_random_model(
        str(d / "base"), "tiny-llama", seed=7, tokenizer=False, vocab_size=256, head_dim=32
    )


def _adapters(root, base: str) -> list:
    out = []
    for i, targets in enumerate((["q_proj", "v_proj"], ["down_proj"], ["up_proj"])):
        path = save_peft_adapter(base, str(root / f"a{i}"), targets, seed=i + 1)
        out.append(LoRARequest(f"a{i}", i + 1, path))
    return out


def _llm(base: str, overlap: bool) -> LLM:
    return LLM(
        base,
        device="cpu",
        dtype="float32",
        enable_lora=True,
        max_loras=2,
        max_cpu_loras=2,
        max_lora_rank=4,
        kv_cache_space=0.01,
        max_model_len=64,
        skip_tokenizer_init=True,
        async_scheduling=overlap,
    )


def _solo(llm: LLM, prompt: list, lora=None) -> list:
    out = llm.generate({"prompt_token_ids": prompt}, SP, lora_request=lora, use_tqdm=False)
    return out[0].outputs[0].token_ids


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
def test_an_unreadable_adapter_fails_its_requests_alone(base, tmp_path, overlap) -> None:
    loras = _adapters(tmp_path, base)
    llm = _llm(base, overlap)
    want = {"base": _solo(llm, PROMPTS[0]), "a1": _solo(llm, PROMPTS[1], loras[1])}
    want["a2"] = _solo(llm, PROMPTS[2], loras[2])  # slots now hold a1, a2; a0 was never run
    eng = llm.llm_engine
    eng.add_request("bad", {"prompt_token_ids": PROMPTS[0]}, SP, lora_request=loras[0])
    eng.add_request("base", {"prompt_token_ids": PROMPTS[0]}, SP)
    eng.add_request("a1", {"prompt_token_ids": PROMPTS[1]}, SP, lora_request=loras[1])
    eng.add_request("a2", {"prompt_token_ids": PROMPTS[2]}, SP, lora_request=loras[2])
    manager = eng.runner.lora
    assert 1 not in manager.host and 1 not in manager.slots  # a0 lives only in its folder
    shutil.rmtree(loras[0].lora_path)
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
    errors = eng.take_request_errors()
    assert list(errors) == ["bad"] and "a0" in str(errors["bad"])
    assert done["bad"].outputs[0].finish_reason == "abort"
    assert not done["bad"].outputs[0].token_ids
    for rid in ("base", "a1", "a2"):  # a2 waited for a0's place, then ran
        assert done[rid].outputs[0].token_ids == want[rid], rid
    assert_no_leak(llm)
    with pytest.raises(ValueError, match="no adapter_config.json"):  # refused when added now
        _solo(llm, PROMPTS[0], loras[0])
    assert _solo(llm, PROMPTS[1], loras[1]) == want["a1"]  # the engine serves on
    assert_no_leak(llm)
