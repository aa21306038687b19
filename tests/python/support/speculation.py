"""Tiny target models, engines and checks shared by the speculative-decoding tests (n-gram and
draft-model speculation, on the CPU and on CUDA)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from support.deps import need
from support.engine import assert_no_leak

# The CPU tests' target: a 2-layer random Llama of head size 32 over 256 token ids.
CPU_TARGET_SHAPE: Dict[str, Any] = dict(
    seed=3,
    tokenizer=False,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    num_hidden_layers=2,
    vocab_size=256,
    max_position_embeddings=1024,
)

# The CUDA tests' models (layers and seed chosen per model): head size 64, 2048 token ids.
CUDA_SHAPE: Dict[str, Any] = dict(
    tokenizer=False,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    vocab_size=2048,
    max_position_embeddings=1024,
)


def save_cpu_target(out_dir: str, tokenizer: bool = False, **over: Any) -> str:
    """Writes the CPU tests' target (``over`` replaces config keys) to ``out_dir``; with the
    SmolLM2 ``tokenizer``, over its vocabulary (the preset's) instead of 256 token ids."""
    from pagedkv.testing import save_random_model

    shape = {**CPU_TARGET_SHAPE, "tokenizer": tokenizer}
    if tokenizer:
        del shape["vocab_size"]
    return save_random_model(out_dir, "tiny-llama", **{**shape, **over})


def save_first_layers(src: str, dst: str, layers: int) -> str:
    """The checkpoint ``src`` cut to its first ``layers`` layers (same embeddings, head and
    tokenizer files) in ``dst``: a smaller draft model whose guesses are often right."""
    from safetensors.torch import load_file, save_file

    for name in os.listdir(src):  # tokenizer files as they are
        if name not in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(src, name), dst)
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["num_hidden_layers"] = layers
    with open(os.path.join(dst, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    weights = load_file(os.path.join(src, "model.safetensors"))
    kept = {
        k: v
        for k, v in weights.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
    }
    save_file(kept, os.path.join(dst, "model.safetensors"))
    return dst


def spec_cpu_llm(model: str, /, **kw: Any) -> Any:
    """An LLM on the CPU with a small cache of 4-token blocks, no tokenizer (``kw`` overrides,
    ``speculative_config`` among them)."""
    from pagedkv import LLM

    args: Dict[str, Any] = dict(
        device="cpu",
        skip_tokenizer_init=True,
        kv_cache_space=0.01,
        max_model_len=256,
        block_size=4,
    )
    return LLM(model, **{**args, **kw})


def output_tokens(llm: Any, params: Any, prompts: Sequence[List[int]]) -> List[List[int]]:
    """The first sample's token ids of each prompt (given as token ids)."""
    inputs = [{"prompt_token_ids": p} for p in prompts]
    return [list(o.outputs[0].token_ids) for o in llm.generate(inputs, params, use_tqdm=False)]


def cuda_greedy_tokens(
    model: str, prompts: Sequence[List[int]], **kw: Any
) -> Tuple[List[List[int]], Any]:
    """64 greedy tokens per prompt from a float32 engine on CUDA (512 blocks of 16 unless
    ``kw`` says otherwise), checked for leaks; returns them and the engine."""
    from pagedkv.engine.llm import LLM
    from pagedkv.engine.sampling_params import SamplingParams

    llm = LLM(
        model,
        device="cuda",
        dtype="float32",
        skip_tokenizer_init=True,
        max_model_len=512,
        block_size=16,
        **{"num_gpu_blocks_override": 512, **kw},
    )
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    tokens = output_tokens(llm, params, prompts)
    assert_no_leak(llm)
    return tokens, llm.llm_engine


def hf_top_k_distribution(
    model_dir: str,
    prompt: List[int],
    steps: int,
    top_k: int,
    temperature: float = 1.0,
    repetition_penalty: float = 1.0,
) -> Dict[tuple, float]:
    """Exact probability of every top-k-truncated continuation of ``steps`` tokens, from dense
    Hugging Face forwards of each prefix; ``repetition_penalty`` as vLLM applies it (logits of
    the tokens in the prompt or the output so far: positive ones divided, negative ones
    multiplied), then ``temperature``."""
    import torch

    transformers = need("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    probs: Dict[tuple, float] = {(): 1.0}
    for _ in range(steps):
        nxt: Dict[tuple, float] = {}
        for prefix, p in probs.items():
            with torch.no_grad():
                logits = hf(torch.tensor([prompt + list(prefix)])).logits[0, -1].double()
            seen = torch.tensor(sorted(set(prompt) | set(prefix)))
            hit = logits[seen]
            logits[seen] = torch.where(hit > 0, hit / repetition_penalty, hit * repetition_penalty)
            top = (logits / temperature).topk(top_k)
            for t, qt in zip(top.indices.tolist(), top.values.softmax(-1).tolist()):
                nxt[prefix + (t,)] = p * qt
        probs = nxt
    return probs


def assert_samples_follow(seen: List[tuple], exact: Dict[tuple, float]) -> None:
    """Chi-square test of the sampled continuations ``seen`` against their exact
    distribution (cells expected below 5 pooled, chi-square's validity rule)."""
    stats_mod = need("scipy.stats")
    n = len(seen)
    assert set(seen) <= set(exact), "a token outside the target's top-k support"
    cells = sorted(exact)
    observed = np.array([seen.count(c) for c in cells], dtype=np.float64)
    expected = np.array([exact[c] for c in cells]) * n
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    p_value = stats_mod.chisquare(observed, expected).pvalue
    assert p_value > 1e-3, f"speculative samples differ from the target (p = {p_value:.2e})"
