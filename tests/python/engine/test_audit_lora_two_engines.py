"""Two LLMs with enable_lora in one process on the same checkpoint (a notebook, a test, a
spec-decode engine next to a plain one): the second served no adapter ("targets ...down_proj,
which is not a supported linear layer") because both shared one loaded model, which the first
had already wrapped with its LoRA layers."""

from __future__ import annotations

from support.deps import need
from support.peft_adapters import save_peft_adapter

torch = need("torch")
peft = need("peft")
transformers = need("transformers")

from pagedkv import LLM, LoRARequest, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


def test_two_lora_engines_on_one_checkpoint(tmp_path) -> None:
    base = save_random_model(
        str(tmp_path / "base"), "tiny-llama", seed=7, tokenizer=False, vocab_size=256, head_dim=32
    )
    save_peft_adapter(base, str(tmp_path / "a1"), ["q_proj", "v_proj", "down_proj"], seed=1)
    lora = LoRARequest("a1", 1, str(tmp_path / "a1"))
    kw = dict(device="cpu", kv_cache_space=0.01, max_model_len=64, skip_tokenizer_init=True)
    prompts = [{"prompt_token_ids": [5, 9, 17, 33, 65, 129]}]
    sp = SamplingParams(temperature=0, max_tokens=6, detokenize=False)
    plain = LLM(base, **kw)
    before = plain.generate(prompts, sp, use_tqdm=False)[0].outputs[0].token_ids
    outs = []
    for _ in range(2):
        llm = LLM(base, enable_lora=True, max_lora_rank=4, **kw)
        outs.append(llm.generate(prompts, sp, lora_request=lora, use_tqdm=False))
    assert outs[0][0].outputs[0].token_ids == outs[1][0].outputs[0].token_ids
    assert outs[0][0].outputs[0].token_ids != before  # the adapter changes the greedy output
    # The plain engine's model was not wrapped under it.
    assert plain.generate(prompts, sp, use_tqdm=False)[0].outputs[0].token_ids == before
