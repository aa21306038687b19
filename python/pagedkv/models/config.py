"""ModelConfig: the shape of a model, from a Hugging Face config.json or from GGUF metadata."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch

from pagedkv.models.attention_backend import AttentionSpec
from pagedkv.models.moe import MoEConfig

# HF architecture name -> the model file (family) that implements it.
_HF_FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "Phi3ForCausalLM": "phi3",
    "Gemma2ForCausalLM": "gemma",
    "Gemma3ForCausalLM": "gemma",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "OPTForCausalLM": "opt",
    # Llama-style decoders with sparse MoE blocks (models/moe.py).
    "MixtralForCausalLM": "llama",
    "Qwen2MoeForCausalLM": "llama",
    "Qwen3MoeForCausalLM": "llama",
    # Multi-head latent attention and grouped-routing MoE (models/deepseek_v2.py).
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v2",
    # Encoders (non-causal attention, no generation: models/bert.py).
    "BertModel": "bert",
    "RobertaModel": "bert",
    "XLMRobertaModel": "bert",
}
# `*ForSequenceClassification` heads on the families above: HF name -> the causal LM it wraps.
SEQUENCE_CLASSIFIERS = {
    "LlamaForSequenceClassification": "LlamaForCausalLM",
    "MistralForSequenceClassification": "MistralForCausalLM",
    "Qwen2ForSequenceClassification": "Qwen2ForCausalLM",
    "Qwen3ForSequenceClassification": "Qwen3ForCausalLM",
    "Phi3ForSequenceClassification": "Phi3ForCausalLM",
    "Gemma2ForSequenceClassification": "Gemma2ForCausalLM",
    "Gemma3ForSequenceClassification": "Gemma3ForCausalLM",
    "GPT2ForSequenceClassification": "GPT2LMHeadModel",
    "GPTNeoXForSequenceClassification": "GPTNeoXForCausalLM",
    "OPTForSequenceClassification": "OPTForCausalLM",
    "MixtralForSequenceClassification": "MixtralForCausalLM",
    "Qwen2MoeForSequenceClassification": "Qwen2MoeForCausalLM",
    "Qwen3MoeForSequenceClassification": "Qwen3MoeForCausalLM",
    "DeepseekV2ForSequenceClassification": "DeepseekV2ForCausalLM",
    "DeepseekV3ForSequenceClassification": "DeepseekV3ForCausalLM",
    # Cross-encoders: the encoder under its own head (pooler / classification head, bert.py).
    "BertForSequenceClassification": "BertModel",
    "RobertaForSequenceClassification": "RobertaModel",
    "XLMRobertaForSequenceClassification": "XLMRobertaModel",
}
# Bare decoders without a head (sentence-transformers saves its AutoModel so: e5-mistral,
# Qwen3-Embedding style embedding models): HF name -> the causal LM whose body they are. Their
# tensors lack the causal LM's "model." prefix; they serve pooling tasks only.
BASE_MODELS = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
}
# Vision-language models: HF name -> the causal LM of their ``text_config`` (the language
# model); the vision tower and projector are the model class's own (models/llava.py).
MULTIMODAL_MODELS = {
    "LlavaForConditionalGeneration": "LlamaForCausalLM",
    "LlavaNextForConditionalGeneration": "LlamaForCausalLM",
    "Qwen2VLForConditionalGeneration": "Qwen2ForCausalLM",
}
# config.json without "architectures": model_type -> HF architecture name.
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM",
    "opt": "OPTForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "bert": "BertModel",
    "roberta": "RobertaModel",
    "xlm-roberta": "XLMRobertaModel",
    "llava": "LlavaForConditionalGeneration",
    "llava_next": "LlavaNextForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
}
# GGUF `general.architecture` -> HF architecture name.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
SLIDING, FULL = "sliding_attention", "full_attention"
ROPE_TYPES = ("linear", "llama3", "dynamic", "yarn", "longrope")


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
    layer_norm_eps: float = 1e-5  # LayerNorm families (GPT-2, GPT-NeoX)
    rope_theta: float = 10000.0
    # Normalised to {"rope_type": one of ROPE_TYPES, ...HF keys} or None.
    rope_scaling: Optional[dict[str, Any]] = None
    rope_local_theta: Optional[float] = None  # Gemma 3: rope base of the sliding layers
    partial_rotary_factor: float = 1.0  # the share of each head's dims that rotary turns
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: biases on q/k/v projections
    mlp_bias: bool = False
    hidden_act: str = "silu"
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorm of each head's q and k before rotary
    attention_scale: Optional[float] = None  # None: 1/sqrt(head_dim)
    attn_logit_softcapping: Optional[float] = None  # Gemma 2
    final_logit_softcapping: Optional[float] = None  # Gemma 2
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Union[int, list[int]]] = None
    torch_dtype: Optional[torch.dtype] = None  # the checkpoint's dtype, used by dtype="auto"
    # The window of the layers whose layer_types entry is "sliding_attention" (every layer when
    # layer_types is None); see attention_spec.
    sliding_window: Optional[int] = None
    layer_types: Optional[list[str]] = None
    num_labels: Optional[int] = None  # *ForSequenceClassification: the score head's outputs
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
        return _HF_FAMILIES[self.causal_architecture]

    @property
    def causal_architecture(self) -> str:
        """The causal LM under a sequence classifier (the architecture itself otherwise)."""
        return _causal(self.architecture)

    @property
    def is_classifier(self) -> bool:
        return self.architecture in SEQUENCE_CLASSIFIERS

    @property
    def is_base_model(self) -> bool:
        """A bare decoder (no head): its final hidden states are all it gives."""
        return self.architecture in BASE_MODELS

    @property
    def is_encoder(self) -> bool:
        """A bidirectional encoder (BERT family): non-causal attention, nothing to generate."""
        return self.family == "bert"

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        eos = self.eos_token_id
        return [eos] if isinstance(eos, int) else list(eos)

    def layer_sliding_window(self, layer_idx: int) -> Optional[int]:
        """The window of layer ``layer_idx``, None where it attends to the whole context."""
        if self.sliding_window is None:
            return None
        if self.layer_types is None or self.layer_types[layer_idx] == SLIDING:
            return self.sliding_window
        return None

    def attention_spec(self, layer_idx: int) -> AttentionSpec:
        """How layer ``layer_idx`` attends: the one place that reads scale, window and cap."""
        scale = self.attention_scale
        return AttentionSpec(
            scale=self.head_dim**-0.5 if scale is None else scale,
            sliding_window=self.layer_sliding_window(layer_idx),
            logits_soft_cap=self.attn_logit_softcapping or 0.0,
            causal=not self.is_encoder,
        )

    def derived_max_model_len(self) -> int:
        """The longest context the model supports, as vLLM derives it: max_position_embeddings,
        times the rope scaling factor for the types that stretch it (llama3 and longrope
        checkpoints, and Gemma 3, state their extended length already; yarn scales its original
        length)."""
        length = self.max_position_embeddings
        s = self.rope_scaling
        # Gemma 3 states its scaled length already (vLLM skips the factor for it too).
        if (
            s
            and s["rope_type"] in ("linear", "dynamic", "yarn")
            and self.causal_architecture != "Gemma3ForCausalLM"
        ):
            if s["rope_type"] == "yarn" and s.get("original_max_position_embeddings"):
                length = int(s["original_max_position_embeddings"])
            length = int(length * float(s["factor"]))
        if self.extra.get("roberta_positions"):  # rows 0..pad_token_id are never a position
            length -= int(self.extra["pad_token_id"]) + 1
        return length

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["torch_dtype"] = str(self.torch_dtype).replace("torch.", "") if self.torch_dtype else None
        return d

    # ---------------------------------------------------------------- Hugging Face config.json
    @classmethod
    def from_hf_dir(cls, path: str, overrides: Optional[dict[str, Any]] = None) -> ModelConfig:
        """config.json of ``path``; ``overrides`` (vLLM's hf_overrides) replace its keys."""
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            d = json.load(f)
        merged = _merge(d, overrides or {})
        nulled = _nulled(overrides or {})
        if not nulled:
            return cls.from_hf_dict(merged)
        # A null stands for "unset" (sliding_window: null turns the window off); where the
        # model needs the key, the error names the override rather than config.json's parse.
        try:
            cfg = cls.from_hf_dict(merged)
            unset = [f.name for f in dataclasses.fields(cfg) if _unset(cfg, f)]
            if unset:
                raise ValueError(f"{', '.join(unset)} left unset")
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(
                f"hf_overrides sets {', '.join(map(repr, nulled))} to null, which the model "
                f"needs: {e}"
            ) from None
        return cfg

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        arch = _architecture(d)
        if arch in MULTIMODAL_MODELS:
            return cls._multimodal(arch, d)
        causal = _causal(arch)
        family = _HF_FAMILIES[causal]
        parse = {
            "opt": _opt_fields,
            "gpt2": _gpt2_fields,
            "gpt_neox": _gpt_neox_fields,
            "gemma": _gemma_fields,
            "deepseek_v2": _deepseek_fields,
            "bert": _bert_fields,
        }.get(family, _llama_fields)
        try:
            fields = parse(causal, d)
            if arch in SEQUENCE_CLASSIFIERS:
                fields["num_labels"] = _num_labels(d)
            return cls(**_hf_common(arch, d), **fields)
        except KeyError as e:
            raise ValueError(f"config.json: {e} is missing (required for {arch})") from None

    @classmethod
    def _multimodal(cls, arch: str, d: dict[str, Any]) -> ModelConfig:
        """A vision-language model: the shape is its language model's (``text_config``); the
        whole config.json stays in ``extra["multimodal"]`` for the vision side. Qwen2-VL hub
        configs keep the text model's keys at the top level; its M-RoPE sections go to
        ``extra["mrope_section"]`` (the rotary itself is plain rope on each section)."""
        text = dict(d.get("text_config") or {k: v for k, v in d.items() if k != "vision_config"})
        mrope = _pop_mrope_section(text)
        for key in ("tie_word_embeddings", "dtype", "torch_dtype"):
            if key not in text and key in d:
                text[key] = d[key]
        if "vocab_size" not in text and "vocab_size" in d:
            text["vocab_size"] = d["vocab_size"]
        text["architectures"] = [MULTIMODAL_MODELS[arch]]
        mc = cls.from_hf_dict(text)
        mc.architecture = arch
        mc.extra["multimodal"] = d
        if mrope is not None:
            mc.extra["mrope_section"] = mrope
        return mc

    # ---------------------------------------------------------------- GGUF metadata
    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
        arch_name = meta["general.architecture"]
        if arch_name not in GGUF_ARCHITECTURES:
            raise ValueError(
                f"GGUF architecture {arch_name!r} is not supported; "
                f"supported: {sorted(GGUF_ARCHITECTURES)}"
            )

        def get(key: str, default: Any = None) -> Any:
            return meta.get(f"{arch_name}.{key}", default)

        heads = int(get("attention.head_count"))
        hidden = int(get("embedding_length"))
        vocab = get("vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        head_dim = int(
            get("attention.key_length") or get("rope.dimension_count") or hidden // heads
        )
        scaling = None
        scaling_type = get("rope.scaling.type")
        if scaling_type in ("linear", "yarn") and get("rope.scaling.factor"):
            scaling = {"rope_type": scaling_type, "factor": float(get("rope.scaling.factor"))}
            if get("rope.scaling.original_context_length"):
                scaling["original_max_position_embeddings"] = int(
                    get("rope.scaling.original_context_length")
                )
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


def _architecture(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or []
    known = {**_HF_FAMILIES, **SEQUENCE_CLASSIFIERS, **BASE_MODELS, **MULTIMODAL_MODELS}
    arch = next((a for a in archs if a in known), None) or _MODEL_TYPES.get(
        d.get("model_type", "") if not archs else ""
    )
    if arch is None:
        raise ValueError(
            f"config.json: unsupported architecture {archs or d.get('model_type')!r}; "
            f"supported: {sorted(known)}"
        )
    return arch


def _causal(arch: str) -> str:
    """The causal LM a classifier or bare decoder is built on (``arch`` itself otherwise)."""
    return (
        SEQUENCE_CLASSIFIERS.get(arch)
        or BASE_MODELS.get(arch)
        or MULTIMODAL_MODELS.get(arch)
        or arch
    )


# The JSON kinds of config.json values an override must keep (int and float are one kind:
# config.json spells rope_theta 10000 or 10000.0). None on either side is not checked (a key
# set to null, or turned off with null, as sliding_window).
_JSON_KINDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("a bool", (bool,)),  # (before the numbers: a bool is an int to isinstance)
    ("a number", (int, float)),
    ("a string", (str,)),
    ("a list", (list, tuple)),
    ("a JSON object", (dict,)),
)


def _json_kind(value: Any) -> Optional[tuple[str, tuple[type, ...]]]:
    return next(((name, t) for name, t in _JSON_KINDS if isinstance(value, t)), None)


def _check_override(name: str, old: Any, new: Any) -> None:
    """An override keeps the kind of the config.json value it replaces, so that a bad one is
    refused here by its key rather than failing later inside the model's set-up ('<' not
    supported between 'str' and 'int')."""
    if old is None or new is None:
        return
    want, got = _json_kind(old), _json_kind(new)
    if want is None or got == want or _number_or_numbers(old) and _number_or_numbers(new):
        return
    raise TypeError(
        f"hf_overrides[{name!r}] must be {want[0]} like config.json's value {old!r}, got "
        f"{type(new).__name__} {new!r}"
    )


def _number_or_numbers(value: Any) -> bool:
    """A number or a list of numbers: the two spellings of a token-id key (eos_token_id 2 or
    [2, 32000]), which an override may swap."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return bool(values) and all(_json_kind(v) == _JSON_KINDS[1] for v in values)


def _nulled(overrides: dict[str, Any], prefix: str = "") -> list[str]:
    """The hf_overrides keys (nested ones by their path) set to null."""
    out = []
    for key, value in overrides.items():
        if value is None:
            out.append(f"{prefix}{key}")
        elif isinstance(value, dict):
            out += _nulled(value, f"{prefix}{key}.")
    return out


def _unset(cfg: ModelConfig, f: dataclasses.Field) -> bool:
    """A ModelConfig field that is None but may not be (its annotation is no Optional)."""
    return getattr(cfg, f.name) is None and not str(f.type).startswith("Optional")


def _merge(d: dict[str, Any], overrides: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """config.json keys replaced by hf_overrides; nested dicts (rope_scaling) are merged."""
    out = dict(d)
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise TypeError(f"hf_overrides keys must be strings, got {key!r}")
        _check_override(prefix + key, out.get(key), value)
        if key == "rope_scaling":  # replaced whole (vLLM's --rope-scaling), in either spelling
            params = out.pop("rope_parameters", None)
            if isinstance(params, dict) and "rope_theta" in params:
                out.setdefault("rope_theta", params["rope_theta"])
            out[key] = value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value, f"{prefix}{key}.")
        else:
            out[key] = value
    if "rope_theta" in overrides and isinstance(out.get("rope_parameters"), dict):
        out["rope_parameters"] = {**out["rope_parameters"], "rope_theta": overrides["rope_theta"]}
    return out


def _num_labels(d: dict[str, Any]) -> int:
    if d.get("num_labels") is not None:
        return int(d["num_labels"])
    return len(d.get("id2label") or {}) or 2  # transformers' default: two labels


def _hf_common(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """The config.json fields every HF family spells the same way (GPT-2's own names too)."""
    dtype_name = d.get("torch_dtype") or d.get("dtype")
    return dict(
        architecture=arch,
        vocab_size=d["vocab_size"],
        hidden_size=d.get("hidden_size") or d["n_embd"],
        num_hidden_layers=d.get("num_hidden_layers") or d["n_layer"],
        num_attention_heads=d.get("num_attention_heads") or d["n_head"],
        max_position_embeddings=d.get("max_position_embeddings") or d.get("n_positions", 2048),
        bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        torch_dtype=_DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None,
        quantization_config=d.get("quantization_config"),
    )


# Per family: HF's defaults for keys a config.json may leave out (transformers fills them in the
# same way, so leaving them out must change nothing).
_TIED_BY_DEFAULT = {"Gemma2ForCausalLM", "Gemma3ForCausalLM"}
_WINDOW_KEYS = {  # architecture -> (default window, needs use_sliding_window)
    "MistralForCausalLM": (4096, False),
    "Qwen2ForCausalLM": (4096, True),
    "Qwen3ForCausalLM": (4096, True),
    "Phi3ForCausalLM": (None, False),
    "Gemma2ForCausalLM": (4096, False),
    "Gemma3ForCausalLM": (4096, False),
    "MixtralForCausalLM": (None, False),
    "Qwen2MoeForCausalLM": (4096, True),
    "Qwen3MoeForCausalLM": (4096, True),
}


def _llama_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """Llama, Mistral, Qwen2, Qwen3 and Phi-3: RMSNorm, gated MLP, rotary."""
    heads = d["num_attention_heads"]
    theta, scaling, _ = _hf_rope(d, 10000.0)
    window, layer_types = _sliding_window(arch, d)
    return dict(
        num_key_value_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        intermediate_size=d["intermediate_size"],
        rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        partial_rotary_factor=_partial_rotary(d, 1.0),
        tie_word_embeddings=d.get("tie_word_embeddings", arch in _TIED_BY_DEFAULT),
        # Qwen2 always has q/k/v biases and no config key for them.
        attention_bias=d.get(
            "attention_bias", d.get("qkv_bias", arch in ("Qwen2ForCausalLM", "Qwen2MoeForCausalLM"))
        ),
        mlp_bias=d.get("mlp_bias", False),
        hidden_act=d.get("hidden_act", "silu"),
        qk_norm=arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"),
        sliding_window=window,
        layer_types=layer_types,
        moe=MoEConfig.from_hf_dict(arch, d),
    )


def _gemma_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """Gemma 2 and Gemma 3 (text): Llama's shape plus soft caps, a query scale of their own,
    and (Gemma 3) q/k norms and a second rope base for the sliding layers."""
    gemma3 = arch == "Gemma3ForCausalLM"
    if d.get("use_bidirectional_attention"):
        raise ValueError(
            "config.json: Gemma with use_bidirectional_attention (an embedding "
            "model) is not supported"
        )
    fields = _llama_fields(
        arch,
        {
            "head_dim": 256,
            "rms_norm_eps": 1e-6,
            **d,
            "hidden_act": d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        },
    )
    theta, scaling, local_theta = _hf_rope(d, 1e6 if gemma3 else 10000.0)
    default_caps = (None, None) if gemma3 else (50.0, 30.0)
    fields.update(
        rope_theta=theta,
        rope_scaling=scaling,
        rope_local_theta=(local_theta or d.get("rope_local_base_freq", 10000.0))
        if gemma3
        else None,
        qk_norm=gemma3,
        attention_scale=float(d.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_logit_softcapping=d.get("attn_logit_softcapping", default_caps[0]),
        final_logit_softcapping=d.get("final_logit_softcapping", default_caps[1]),
    )
    return fields


def _deepseek_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """DeepSeek-V2 / V3: multi-head latent attention (its shape in ``extra``, read by
    models/deepseek_v2.py) and MoE layers with grouped routing (models/moe.py). The paged cache
    holds each head's decompressed key [nope | rope] and value, both padded to ``head_dim``, the
    larger of the two; the softmax scale is transformers' (1/sqrt(nope + rope), times mscale^2
    under YaRN with mscale_all_dim)."""
    heads = d["num_attention_heads"]
    if (d.get("num_key_value_heads") or heads) != heads:
        raise ValueError(
            f"config.json: {arch} with num_key_value_heads != num_attention_heads is not "
            "supported (every head decompresses its own key and value from the latent)"
        )
    nope, rope, v = d["qk_nope_head_dim"], d["qk_rope_head_dim"], d["v_head_dim"]
    theta, scaling, _ = _hf_rope(d, 10000.0)
    if scaling and scaling["rope_type"] == "yarn" and scaling.get("factor") is None:
        # transformers' rule for a YaRN config without a factor (DeepSeek-V3 style).
        original = scaling["original_max_position_embeddings"]
        scaling["factor"] = d["max_position_embeddings"] / original
    scale = (nope + rope) ** -0.5
    if scaling and scaling.get("mscale_all_dim"):
        factor = float(scaling["factor"])
        m = 1.0 if factor <= 1 else 0.1 * float(scaling["mscale_all_dim"]) * math.log(factor) + 1.0
        scale *= m * m
    v3 = arch == "DeepseekV3ForCausalLM"
    return dict(
        num_key_value_heads=heads,
        head_dim=max(nope + rope, v),
        intermediate_size=d["intermediate_size"],
        rms_norm_eps=d.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=d.get("tie_word_embeddings", False),
        attention_bias=d.get("attention_bias", False),
        mlp_bias=False if v3 else d.get("mlp_bias", False),  # DeepseekV3MLP has no biases
        hidden_act=d.get("hidden_act", "silu"),
        attention_scale=scale,
        moe=MoEConfig.from_hf_dict(arch, d),
        extra={
            "q_lora_rank": d.get("q_lora_rank"),
            "kv_lora_rank": d["kv_lora_rank"],
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope,
            "v_head_dim": v,
            # V3's rope_interleave and V2's complex rotation both turn (2i, 2i + 1) pairs.
            "rope_interleave": bool(d.get("rope_interleave", True)) if v3 else True,
        },
    )


def _gpt2_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    hidden, heads = d["n_embd"], d["n_head"]
    if d.get("scale_attn_by_inverse_layer_idx"):
        raise ValueError("config.json: GPT-2 with scale_attn_by_inverse_layer_idx is not supported")
    return dict(
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=d.get("n_inner") or 4 * hidden,
        layer_norm_eps=d.get("layer_norm_epsilon", 1e-5),
        tie_word_embeddings=d.get("tie_word_embeddings", True),
        attention_bias=True,
        mlp_bias=True,
        hidden_act=d.get("activation_function", "gelu_new"),
        attention_scale=None if d.get("scale_attn_weights", True) else 1.0,
    )


def _gpt_neox_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    heads = d["num_attention_heads"]
    theta, scaling, _ = _hf_rope({"rope_theta": d.get("rotary_emb_base", 10000.0), **d}, 10000.0)
    return dict(
        num_key_value_heads=heads,
        head_dim=d["hidden_size"] // heads,
        intermediate_size=d["intermediate_size"],
        layer_norm_eps=d.get("layer_norm_eps", 1e-5),
        rope_theta=theta,
        rope_scaling=scaling,
        partial_rotary_factor=_partial_rotary(d, float(d.get("rotary_pct", 0.25))),
        tie_word_embeddings=d.get("tie_word_embeddings", False),
        attention_bias=d.get("attention_bias", True),
        mlp_bias=True,
        hidden_act=d.get("hidden_act", "gelu"),
        extra={"use_parallel_residual": d.get("use_parallel_residual", True)},
    )


def _opt_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    heads = d["num_attention_heads"]
    return dict(
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


def _bert_fields(arch: str, d: dict[str, Any]) -> dict[str, Any]:
    """BERT / RoBERTa / XLM-R: post-LayerNorm blocks with biases everywhere, learned absolute
    positions (RoBERTa's start after padding_idx) and token-type embeddings."""
    kind = d.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(
            f"config.json: position_embedding_type {kind!r} is not supported for {arch} "
            "(only 'absolute')"
        )
    if d.get("is_decoder") or d.get("add_cross_attention"):
        raise ValueError(f"config.json: {arch} as a decoder (is_decoder) is not supported")
    heads = d["num_attention_heads"]
    roberta = arch != "BertModel"
    return dict(
        num_key_value_heads=heads,
        head_dim=d["hidden_size"] // heads,
        intermediate_size=d["intermediate_size"],
        layer_norm_eps=d.get("layer_norm_eps", 1e-12),
        attention_bias=True,
        mlp_bias=True,
        hidden_act=d.get("hidden_act", "gelu"),
        extra={
            "type_vocab_size": d.get("type_vocab_size", 2),
            # RoBERTa / XLM-R number positions from pad_token_id + 1 (HF's padding_idx), and
            # give pad tokens the position pad_token_id.
            "roberta_positions": roberta,
            "pad_token_id": d.get("pad_token_id", 1 if roberta else 0),
        },
    )


def _sliding_window(arch: str, d: dict[str, Any]) -> tuple[Optional[int], Optional[list[str]]]:
    """(window, layer types) as transformers reads them: Mistral, Mixtral and Phi-3 slide on
    every layer; Qwen2/3 only with use_sliding_window, on layers from max_window_layers on
    (Qwen3-MoE on all, Qwen2-MoE on every other one below it); Gemma 2 on every
    other layer from the first, Gemma 3 on five of each six; an explicit layer_types wins."""
    if arch not in _WINDOW_KEYS:
        return None, None  # Llama: transformers ignores a sliding_window key
    default, needs_flag = _WINDOW_KEYS[arch]
    window = d.get("sliding_window", default)
    if window is None or (needs_flag and not d.get("use_sliding_window", False)):
        return None, None
    n = d["num_hidden_layers"]
    types = d.get("layer_types")
    if types is None:
        if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
            first = d.get("max_window_layers", 28)
            types = [SLIDING if i >= first else FULL for i in range(n)]
        elif arch == "Qwen2MoeForCausalLM":  # every other layer below max_window_layers
            last = d.get("max_window_layers", 28)
            types = [SLIDING if (i + 1) % 2 and i < last else FULL for i in range(n)]
        elif arch == "Gemma2ForCausalLM":
            types = [SLIDING if (i + 1) % 2 else FULL for i in range(n)]
        elif arch == "Gemma3ForCausalLM":
            pattern = d.get("sliding_window_pattern", 6)
            types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
        else:
            types = [SLIDING] * n
    unknown = sorted(set(types) - {SLIDING, FULL})
    if unknown or len(types) != n:
        raise ValueError(
            f"config.json: layer_types must list {n} entries of {SLIDING!r} / "
            f"{FULL!r}; got {len(types)} entries" + (f" with {unknown}" if unknown else "")
        )
    return int(window), list(types)


def _pop_mrope_section(text: dict[str, Any]) -> Optional[list[int]]:
    """Removes M-RoPE from a text config's rope keys (transformers 4: rope_scaling {"type":
    "mrope", "mrope_section"}; 5: rope_parameters {"rope_type": "default", "mrope_section"});
    returns the sections, or None."""
    section = None
    for key in ("rope_scaling", "rope_parameters"):
        params = text.get(key)
        if isinstance(params, dict) and "mrope_section" in params:
            params = dict(params)
            section = [int(v) for v in params.pop("mrope_section")]
            for name in ("type", "rope_type"):
                if params.get(name) == "mrope":
                    params[name] = "default"
            text[key] = params
    return section


def _partial_rotary(d: dict[str, Any], default: float) -> float:
    params = d.get("rope_parameters") or {}
    return float(d.get("partial_rotary_factor") or params.get("partial_rotary_factor") or default)


def _hf_rope(
    d: dict[str, Any], default_theta: float
) -> tuple[float, Optional[dict[str, Any]], Optional[float]]:
    """(theta, scaling, sliding layers' theta) from transformers 4 style configs (`rope_theta`
    + `rope_scaling`) or transformers 5 ones (`rope_parameters`, maybe one per layer type)."""
    params = dict(d.get("rope_parameters") or {})
    local_theta = None
    if FULL in params or SLIDING in params:
        local = params.get(SLIDING) or {}
        local_theta = float(local["rope_theta"]) if "rope_theta" in local else None
        params = dict(params.get(FULL) or {})
    theta = float(params.get("rope_theta", d.get("rope_theta", default_theta)))
    scaling = dict(d.get("rope_scaling") or params)
    scaling.pop("rope_theta", None)
    scaling.pop("partial_rotary_factor", None)
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None)
    scaling.pop("type", None)
    if rope_type in (None, "default"):
        return theta, None, local_theta
    rope_type = "longrope" if rope_type == "su" else rope_type  # Phi-3's first name for it
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"config.json: rope scaling type {rope_type!r} is not supported; "
            f"supported: {', '.join(ROPE_TYPES)}"
        )
    scaling["rope_type"] = rope_type
    if rope_type == "longrope":
        scaling.setdefault(
            "original_max_position_embeddings", d.get("original_max_position_embeddings")
        )
        scaling["max_position_embeddings"] = d.get("max_position_embeddings")
    return theta, scaling, local_theta
