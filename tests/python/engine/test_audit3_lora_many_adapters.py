"""An engine runs more distinct adapters over its life than it has device slots and host
places: with max_loras = max_cpu_loras = 1 (the default max_cpu_loras), a second adapter was
refused for good ("all are in device slots") once the first had held the slot, although no
request used it any more. Host memory is now a cache: an adapter evicted from it is read from
its folder again when a step needs it."""

from __future__ import annotations

from support.deps import need
from support.engine import assert_no_leak
from support.peft_adapters import save_peft_adapter

torch = need("torch")
peft = need("peft")
transformers = need("transformers")

from pagedkv import LLM, LoRARequest, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

PROMPT = [{"prompt_token_ids": [5, 9, 17, 33, 65, 129]}]


def _adapters(tmp_path, base: str) -> list:
    out = []
    for i, targets in enumerate((["q_proj", "v_proj"], ["down_proj"], ["k_proj", "up_proj"])):
        save_peft_adapter(base, str(tmp_path / f"a{i}"), targets, seed=i + 1)
        out.append(LoRARequest(f"a{i}", i + 1, str(tmp_path / f"a{i}")))
    return out


def test_adapters_take_turns_in_one_slot(tmp_path) -> None:
    base = save_random_model(
        str(tmp_path / "base"), "tiny-llama", seed=7, tokenizer=False, vocab_size=256, head_dim=32
    )
    loras = _adapters(tmp_path, base)
    kw = dict(device="cpu", kv_cache_space=0.01, max_model_len=64, skip_tokenizer_init=True)
    sp = SamplingParams(temperature=0, max_tokens=6, detokenize=False)
    llm = LLM(base, enable_lora=True, max_loras=1, max_lora_rank=4, **kw)

    def run(lora):
        return llm.generate(PROMPT, sp, lora_request=lora, use_tqdm=False)[0].outputs[0].token_ids

    first = [run(lora) for lora in loras]  # each evicts the previous one
    assert len({tuple(t) for t in first}) == 3  # three different adapters really ran
    assert [run(lora) for lora in reversed(loras)] == first[::-1]  # reloaded, same answers
    # Mixed in one call: the admission queue runs them one adapter at a time.
    mixed = llm.generate(PROMPT * 3, sp, lora_request=loras, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed] == first
    assert_no_leak(llm)
