"""LLM(enable_lora=True) with two PEFT adapters on a tiny random Llama: greedy outputs equal HF's
PEFT-merged model for each adapter, with both adapters and the base model in one batch, with
fewer device slots than adapters (requests wait their turn), under preemption, and with the same
prompt under different adapters (the prefix cache never hands one adapter's blocks to another)."""

from __future__ import annotations

import pytest
from support.deps import need
from support.peft_adapters import save_peft_adapter

torch = need("torch")
transformers = need("transformers")
peft = need("peft")

from pagedkv import LLM, LoRARequest, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 256
MAX_TOKENS = 6


def _adapter(base: str, out: str, seed: int, rank: int, targets: list[str]) -> str:
    return save_peft_adapter(base, out, targets, seed, rank)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_engine")
    base = save_random_model(
        str(d / "base"), "tiny-llama", seed=7, tokenizer=False, vocab_size=VOCAB, head_dim=32
    )
    paths = [
        _adapter(
            base,
            str(d / "a1"),
            1,
            8,
            ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
        _adapter(base, str(d / "a2"), 2, 4, ["q_proj", "v_proj", "up_proj"]),
    ]
    models = [transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)]
    for p in paths:
        m = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        models.append(peft.PeftModel.from_pretrained(m, p).merge_and_unload())
    loras = [None] + [LoRARequest(f"a{i}", i, p) for i, p in enumerate(paths, start=1)]
    return base, models, loras


def _expected(models, prompt: list[int], which: int) -> list[int]:
    with torch.no_grad():
        out = (
            models[which]
            .eval()
            .generate(
                torch.tensor([prompt]),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                pad_token_id=0,
            )
        )
    return out[0, len(prompt) :].tolist()


def _llm(base: str, **kw) -> LLM:
    cuda = kw.get("device") == "cuda"
    memory = {"gpu_memory_utilization": 0.2} if cuda else {"device": "cpu", "kv_cache_space": 0.01}
    return LLM(
        base,
        **memory,
        **kw,
        skip_tokenizer_init=True,
        enable_lora=True,
        max_lora_rank=8,
        max_model_len=128,
    )


def _check(llm, models, loras, prompts, which) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        params,
        use_tqdm=False,
        lora_request=[loras[w] for w in which],
    )
    for p, w, o in zip(prompts, which, outs):
        assert list(o.outputs[0].token_ids) == _expected(models, p, w), (w, p)
    eng = llm.llm_engine
    assert not eng.has_unfinished_requests()
    assert eng.scheduler.num_free_blocks == eng.num_gpu_blocks


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(5 + 7 * i % 23),), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("kernel", ["auto", "grouped_mm", "dense"])
def test_mixed_batch_and_shared_prefix(world, kernel: str) -> None:
    if kernel == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    base, models, loras = world
    llm = _llm(base, max_loras=2, lora_kernel=kernel)
    prompts = _prompts(6, 0)
    _check(llm, models, loras, prompts, [1, 2, 0, 1, 2, 0])
    # one 40-token prompt under each adapter, twice: the second round hits the cache of its own
    # adapter only (a hit from another adapter would change the greedy tokens)
    shared = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    for _ in range(2):
        _check(llm, models, loras, [shared] * 3, [0, 1, 2])
    assert llm.llm_engine.get_stats()["prefix_cache_hits"] > 0


def test_fewer_slots_than_adapters_and_preemption(world) -> None:
    base, models, loras = world
    # one slot: requests of the other adapter wait; 30-token prompts growing past two blocks
    # of 16 in 7 blocks force preemptions
    llm = _llm(base, max_loras=1, max_cpu_loras=2, num_gpu_blocks_override=7)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, VOCAB, (30,), generator=g).tolist() for _ in range(8)]
    _check(llm, models, loras, prompts, [1, 2, 0, 2, 1, 0, 2, 1])
    assert llm.llm_engine.get_stats()["num_preemptions"] > 0
    with pytest.raises(ValueError, match="enable_lora"):
        LLM(
            base, device="cpu", skip_tokenizer_init=True, kv_cache_space=0.01, max_model_len=64
        ).generate([{"prompt_token_ids": [5, 6]}], lora_request=loras[1], use_tqdm=False)


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["auto", "dense"])
def test_cuda_graphs_run_adapters(world, kernel: str) -> None:
    """On the GPU, decode steps with adapters replay the CUDA graphs captured with the LoRA
    kernels (eager only for prefills): the same tokens as HF's merged models, for a batch that
    mixes both adapters and the base model."""
    base, models, loras = world
    llm = _llm(
        base, max_loras=2, device="cuda", dtype="float32", max_num_seqs=8, lora_kernel=kernel
    )
    runner = llm.llm_engine.runner
    if kernel != "auto":
        assert {layer.kernel for layer in runner.lora.targets.layers} == {kernel}
    assert runner.graphs is not None and runner.graphs.lora_graphs
    before = runner.graphs.num_replays
    _check(llm, models, loras, _prompts(6, 3), [1, 2, 0, 2, 1, 0])
    assert runner.graphs.num_replays >= before + MAX_TOKENS - 1


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["grouped_mm", "dense", "pagedkv_tiled"])
def test_cuda_graphs_bf16_kernels(world, kernel: str) -> None:
    """lora_kernel="grouped_mm" (torch._grouped_mm, bf16 on sm90+), "dense" and "pagedkv_tiled"
    through the engine's CUDA graphs in bf16 give the tokens of the core's kernel: greedy
    tokens agree until a near tie (the kernels round the bf16 deltas differently), where the
    logprobs still agree."""
    if kernel == "grouped_mm" and (
        not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability() < (9, 0)
    ):
        pytest.skip("torch._grouped_mm's fast path needs sm90+")
    base, _, loras = world
    prompts = [{"prompt_token_ids": p} for p in _prompts(6, 4)]
    which = [loras[w] for w in (1, 2, 0, 2, 1, 1)]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    runs = {}
    for k in (kernel, "pagedkv"):
        llm = _llm(base, max_loras=2, device="cuda", dtype="bfloat16", lora_kernel=k)
        runner = llm.llm_engine.runner
        assert {layer.kernel for layer in runner.lora.targets.layers} == {k}
        before = runner.graphs.num_replays
        runs[k] = llm.generate(prompts, params, use_tqdm=False, lora_request=which)
        assert runner.graphs.num_replays >= before + MAX_TOKENS - 1
        del llm, runner
    for got, want in zip(runs[kernel], runs["pagedkv"]):
        g, w = got.outputs[0], want.outputs[0]
        for pos, (tg, tw) in enumerate(zip(g.token_ids, w.token_ids)):
            lp_g, lp_w = g.logprobs[pos], w.logprobs[pos]
            assert abs(lp_g[tg].logprob - lp_w[tw].logprob) < 0.05, (pos, tg, tw)
            if tg != tw:  # a near tie: the other kernel's token is as likely here
                assert tw in lp_g and abs(lp_g[tw].logprob - lp_g[tg].logprob) < 0.05
                break
