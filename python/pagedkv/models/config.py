"""ModelConfig: the shape of a model, from a Hugging Face config.json or from GGUF metadata."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from pagedkv.models.moe import MoEConfig

# HF architecture name -> the family our code implements it with.
_HF_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "OPTForCausalLM": "opt",
    # Llama-style decoders with sparse MoE blocks (models/moe.py).
    "MixtralForCausalLM": "llama",
    "Qwen2MoeForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "llama",
}
# GGUF `general.architecture` -> HF architecture name.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ModelConfig:
    architecture: str  # HF class name, e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Normalised to {"rope_type": "llama3" | "linear" | "dynamic" | "yarn", ...HF keys} or None.
    rope_scaling: Optional[dict[str, Any]] = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q/k/v projections
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Union[int, list[int]]] = None
    torch_dtype: Optional[torch.dtype] = None  # the checkpoint's dtype, used by dtype="auto"
    sliding_window: Optional[int] = None  # recorded only; attention here is always full
    # OPT only.
    word_embed_proj_dim: Optional[int] = None
    do_layer_norm_before: bool = True
    layer_norm_elementwise_affine: bool = True
    moe: Optional[MoEConfig] = None  # the experts of Mixtral / Qwen-MoE (models/moe.py)
    # config.json's quantization_config, as written (models/quantization reads it).
    quantization_config: Optional[dict[str, Any]] = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def family(self) -> str:
        return _HF_FAMILIES[self.architecture]

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        eos = self.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["torch_dtype"] = str(self.torch_dtype).replace("torch.", "") if self.torch_dtype else None
        return d

    # ---------------------------------------------------------------- Hugging Face config.json
    @classmethod
    def from_hf_dir(cls, path: str) -> ModelConfig:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            return cls.from_hf_dict(json.load(f))

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        archs = d.get("architectures") or []
        arch = next((a for a in archs if a in _HF_FAMILIES), None)
        if arch is None:
            model_type = d.get("model_type", "")
            arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                    "qwen2": "Qwen2ForCausalLM", "opt": "OPTForCausalLM",
                    "mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                    "qwen3_moe": "Qwen3MoeForCausalLM"}.get(model_type)
        if arch is None:
            raise ValueError(
                f"config.json: unsupported architecture {archs or d.get('model_type')!r}; "
                f"supported: {sorted(_HF_FAMILIES)}")
        if _HF_FAMILIES[arch] == "opt":
            return cls._from_opt_dict(arch, d)
        heads = d["num_attention_heads"]
        theta, scaling = _hf_rope(d)
        return cls(
            **_hf_common(arch, d),
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            intermediate_size=d["intermediate_size"],
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=d.get("tie_word_embeddings", False),
            # Qwen2 always has q/k/v biases and no config key for them.
            attention_bias=d.get("attention_bias", d.get(
                "qkv_bias", arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"))),
            mlp_bias=d.get("mlp_bias", False),
            hidden_act=d.get("hidden_act", "silu"),
            sliding_window=d.get("sliding_window") if d.get("use_sliding_window", True) else None,
            moe=MoEConfig.from_hf_dict(arch, d),
            quantization_config=d.get("quantization_config"),
        )

    @classmethod
    def _from_opt_dict(cls, arch: str, d: dict[str, Any]) -> ModelConfig:
        heads = d["num_attention_heads"]
        return cls(
            **_hf_common(arch, d),
            num_key_value_heads=heads,
            head_dim=d["hidden_size"] // heads,
            intermediate_size=d["ffn_dim"],
            tie_word_embeddings=d.get("tie_word_embeddings", True),
            attention_bias=d.get("enable_bias", True),
            mlp_bias=d.get("enable_bias", True),
            hidden_act=d.get("activation_function", "relu"),
            word_embed_proj_dim=d.get("word_embed_proj_dim") or d["hidden_size"],
            do_layer_norm_before=d.get("do_layer_norm_before", True),
            layer_norm_elementwise_affine=d.get("layer_norm_elementwise_affine", True),
            extra={"remove_final_layer_norm": d.get("_remove_final_layer_norm", False)},
        )

    # ---------------------------------------------------------------- GGUF metadata
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
        arch_name = meta["general.architecture"]
        if arch_name not in GGUF_ARCHITECTURES:
            raise ValueError(f"GGUF architecture {arch_name!r} is not supported; "
                             f"supported: {sorted(GGUF_ARCHITECTURES)}")

        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"{arch_name}.{key}", default)

        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        head_dim = int(get("attention.key_length") or get("rope.dimension_count")
                       or hidden // heads)
        scaling = None
        scaling_type = get("rope.scaling.type")
        if scaling_type in ("linear", "yarn") and get("rope.scaling.factor"):
            scaling = {"rope_type": scaling_type, "factor": float(get("rope.scaling.factor"))}
            if get("rope.scaling.original_context_length"):
                scaling["original_max_position_embeddings"] = int(
                    get("rope.scaling.original_context_length"))
        return cls(
            architecture=GGUF_ARCHITECTURES[arch_name],
            vocab_size=int(vocab),
            hidden_size=hidden,
            num_hidden_layers=int(get("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(get("attention.head_count_kv") or heads),
            head_dim=head_dim,
            intermediate_size=int(get("feed_forward_length")),
            max_position_embeddings=int(get("context_length", 2048)),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(get("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            tie_word_embeddings="output.weight" not in tensor_names,
            attention_bias="blk.0.attn_q.bias" in tensor_names,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
            torch_dtype=torch.float32,  # dequantized weights come out as float32
        )


def _hf_common(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """The config.json fields every HF family spells the same way."""
    dtype_name = d.get("torch_dtype") or d.get("dtype")
    return dict(
        architecture=arch,
        vocab_size=d["vocab_size"],
        hidden_size=d["hidden_size"],
        num_hidden_layers=d["num_hidden_layers"],
        num_attention_heads=d["num_attention_heads"],
        max_position_embeddings=d.get("max_position_embeddings", 2048),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        torch_dtype=_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None,
    )


def _hf_rope(d: dict[str, Any]) -> tuple[float, Optional[dict[str, Any]]]:
    """Reads rope theta and scaling from either transformers 4 (`rope_theta` + `rope_scaling`)
    or transformers 5 (`rope_parameters`) style configs."""
    params = d.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", d.get("rope_theta", 10000.0)))
    scaling = dict(d.get("rope_scaling") or params)
    scaling.pop("rope_theta", None)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None)
    if rope_type in (None, "default"):
        return theta, None
    if rope_type not in ("linear", "llama3", "dynamic", "yarn"):
        raise ValueError(f"config.json: rope scaling type {rope_type!r} is not supported")
    scaling["rope_type"] = rope_type
    return theta, scaling
