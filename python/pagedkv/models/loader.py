"""load_model(): a checkpoint (HF directory or GGUF file) -> (model on device, ModelConfig)."""

from __future__ import annotations

import glob
import json
import os
from typing import Any, Callable, Iterator, Optional, Union

import torch
from torch import nn

from pagedkv.models.config import ModelConfig
from pagedkv.models.progress import progress_bar
from pagedkv.models.registry import ModelSource, model_class, resolve_model

DTypeLike = Union[torch.dtype, str, None]
_DTYPE_NAMES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: DTypeLike, config: ModelConfig, device: torch.device) -> torch.dtype:
    """ "auto": float32 on the CPU; on a GPU the checkpoint's half type, else bfloat16."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        ckpt = config.torch_dtype
        return ckpt if ckpt in (torch.float16, torch.bfloat16) else torch.bfloat16
    if dtype not in _DTYPE_NAMES:
        raise ValueError(
            f"dtype {dtype!r} is not supported; use 'auto', 'float32', 'float16' or 'bfloat16'"
        )
    return _DTYPE_NAMES[dtype]


def load_config(source: ModelSource, hf_overrides: Optional[dict[str, Any]] = None) -> ModelConfig:
    """The checkpoint's ModelConfig; ``hf_overrides`` (vLLM's) replace config.json keys."""
    if source.kind == "hf":
        return ModelConfig.from_hf_dir(source.path, hf_overrides)
    if hf_overrides:
        raise ValueError(
            "hf_overrides apply to Hugging Face checkpoints (config.json); this "
            f"model is a GGUF file ({source.path})"
        )
    from pagedkv.models.gguf_reader import gguf_config, open_gguf

    return gguf_config(open_gguf(source.path))


def hf_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of an HF checkpoint: *.safetensors (sharded or not), else pytorch_model*.bin."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(path, name) for name in files]
    else:
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors import safe_open

        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    yield name, f.get_tensor(name)
        return
    bins = sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))
    if not bins:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {path!r}")
    for file in bins:
        yield from torch.load(file, map_location="cpu", weights_only=True).items()


def checkpoint_weights(
    source: ModelSource, config: ModelConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    if source.kind == "hf":
        return _progress(hf_weights(source.path), None, "Loading weights")
    from pagedkv.models.gguf_reader import gguf_weights, open_gguf

    reader = open_gguf(source.path)
    return _progress(
        gguf_weights(reader, config), len(reader.tensors), "Loading GGUF tensors (dequantizing)"
    )


def _progress(
    weights: Iterator[tuple[str, torch.Tensor]], total: Optional[int], desc: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """A progress bar over the tensors (see pagedkv.models.progress for when it shows):
    dequantizing or reading a large checkpoint takes long enough to look hung without one."""
    bar = progress_bar(weights, total=total, desc=desc, unit=" tensors", transient=True)
    return weights if bar is None else iter(bar)


def build_empty(config: ModelConfig, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The model allocated on ``device`` in ``dtype``, parameters uninitialised."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_class(config.architecture)(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def load_model(
    model: Optional[str] = None,
    dtype: DTypeLike = "auto",
    device: Union[torch.device, str] = "cpu",
    quantization: Optional[str] = None,
    *,
    revision: Optional[str] = None,
    download_dir: Optional[str] = None,
    hf_overrides: Optional[dict[str, Any]] = None,
    check: Optional[Callable[[ModelConfig], None]] = None,
) -> tuple[nn.Module, ModelConfig]:
    """Loads ``model`` (see resolve_model: a path, the packaged default or a hub id at
    ``revision``, cached in ``download_dir``) -> (torch module on ``device``, its ModelConfig).
    ``quantization``: vLLM's argument (models/quantization); the checkpoint's own
    quantization_config is applied without it. ``check`` may refuse the config before any
    weight is read (the engine's head sizes)."""
    from pagedkv.models import quantization as quant

    device = torch.device(device)
    source = resolve_model(model, revision, download_dir)
    config = load_config(source, hf_overrides)
    if check is not None:
        check(config)
    method = quant.resolve_quantization(config.quantization_config, quantization)
    net: Any = build_empty(config, resolve_dtype(dtype, config, device), device)
    if method is not None:
        quant.quantize_model(net, method)
    net.load_weights(checkpoint_weights(source, config))
    if method is not None:
        quant.finish_quantization(net)
    net.source = source
    return net, config
