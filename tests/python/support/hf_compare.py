"""Greedy generation by HF transformers and by the pagedkv engine on the same checkpoint, and
the comparison the model tests share: the same tokens, and logprobs of those tokens within a
tolerance."""

from __future__ import annotations

from typing import Any

Greedy = list[tuple[list[int], list[float]]]  # per prompt: (tokens, logprob of each token)


def hf_greedy(
    path: str,
    prompts: list[list[int]],
    max_tokens: int,
    dtype: Any = None,
    attn_implementation: str | None = "eager",
) -> Greedy:
    """HF ``generate`` (greedy, its own KV cache) from each prompt alone, EOS disabled; the
    logprobs are the log-softmax of its raw logits. The attention is HF's eager one: the
    reference math in every transformers version (a default of "sdpa" drops Gemma 2's
    attention soft cap in the versions that pick it for Gemma 2); None: transformers' default."""
    import torch
    import transformers

    dtype = dtype or torch.float32
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=attn_implementation
    ).eval()
    ref.generation_config.eos_token_id = None
    out: Greedy = []
    for prompt in prompts:
        with torch.no_grad():
            gen = ref.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=0,
            )
        tokens = gen.sequences[0, len(prompt) :].tolist()
        logprobs = [
            float(torch.log_softmax(step[0].double(), -1)[t]) for step, t in zip(gen.logits, tokens)
        ]
        out.append((tokens, logprobs))
    return out


def engine_greedy(llm: Any, prompts: list[list[int]], max_tokens: int) -> Greedy:
    from pagedkv import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result: Greedy = []
    for o in outs:
        c = o.outputs[0]
        result.append(
            (list(c.token_ids), [c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)])
        )
    return result


def assert_same_greedy(got: Greedy, expected: Greedy, tol: float = 1e-4) -> float:
    """Token for token equal, logprobs within ``tol``; returns the largest logprob gap. The
    reference must be informative: a model whose every greedy token has probability ~1 would
    agree with a wrong implementation too."""
    ref_lps = [lp for _, lps in expected for lp in lps]
    assert sum(ref_lps) / len(ref_lps) < -0.05, "the reference's greedy tokens are all certain"
    worst = 0.0
    for i, ((tokens, lps), (ref_tokens, ref_lps)) in enumerate(zip(got, expected, strict=True)):
        assert tokens == ref_tokens, f"prompt {i}: {tokens} != HF {ref_tokens}"
        for j, (a, b) in enumerate(zip(lps, ref_lps)):
            worst = max(worst, abs(a - b))
            assert abs(a - b) < tol, f"prompt {i}, token {j}: logprob {a} vs HF {b}"
    return worst


def random_prompts(seed: int, vocab: int) -> list[list[int]]:
    """3 prompts of 5 to 39 random token ids (ids 0-2 left out: special tokens)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, int(n)).tolist() for n in rng.integers(5, 40, 3)]


def chunked_cpu_llm(path: str) -> Any:
    """The float32 CPU engine on a tokenizer-less checkpoint with small blocks and steps: the
    prompts prefill in chunks and decode across many blocks."""
    from pagedkv import LLM

    return LLM(
        path,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        seed=0,
        block_size=8,
        num_gpu_blocks_override=64,
        max_model_len=128,
        max_num_batched_tokens=32,
    )


# A Mistral-shaped model small enough for windows of a few tokens over several blocks.
WINDOWED_SHAPE = dict(
    hidden_size=64,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=512,
)


def windowed_cpu_llm(path: str, **kw: Any) -> Any:
    """The float32 CPU engine with blocks of 4 tokens, so that a window of a few tokens ends
    inside a block and decodes cross many; ``kw``: more engine arguments."""
    from pagedkv import LLM

    return LLM(
        path,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        seed=0,
        block_size=4,
        num_gpu_blocks_override=256,
        max_model_len=256,
        **kw,
    )


def assert_engine_matches_hf(path: str, prompts: list[list[int]], max_tokens: int = 16) -> float:
    """chunked_cpu_llm's greedy tokens equal HF's (assert_same_greedy); returns the largest
    logprob gap."""
    return assert_same_greedy(
        engine_greedy(chunked_cpu_llm(path), prompts, max_tokens),
        hf_greedy(path, prompts, max_tokens),
    )


def assert_classifier_matches_hf(
    path: str, prompts: list[list[int]], num_labels: int
) -> tuple[Any, Any]:
    """A *ForSequenceClassification checkpoint: our model's class logits of each prompt's last
    token (the prompts run as one batch) equal HF's, float32, within 1e-4. Returns our model
    and its hidden states of the batch, for more checks."""
    import numpy as np
    import torch
    import transformers
    from pagedkv.models import load_model
    from pagedkv.models.reference_backend import DenseAttentionBackend

    model, config = load_model(path, torch.float32, "cpu")
    assert config.is_classifier and config.num_labels == num_labels
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32
    ).eval()
    seqs = [torch.tensor(p) for p in prompts]
    loc = np.cumsum([0] + [len(s) for s in seqs]).tolist()
    hidden = model(
        torch.cat(seqs), torch.cat([torch.arange(len(s)) for s in seqs]), DenseAttentionBackend(loc)
    )
    got = model.classify(hidden[[b - 1 for b in loc[1:]]])
    with torch.no_grad():
        expected = torch.cat([ref(s[None]).logits for s in seqs])
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    return model, hidden
