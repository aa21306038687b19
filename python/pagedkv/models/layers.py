"""Small building blocks shared by the model files, and the fused-weight loading helper."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch
import torch.nn.functional as F
from torch import nn

# Inference-only layers: parameters start uninitialised (torch.empty) because every one of them
# is overwritten by the checkpoint; torch.nn's random init of a 1B model costs seconds.


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias \
            else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim),
                                   requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine \
            else None
        self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine \
            else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm; ``unit_offset`` (Gemma) scales by ``1 + weight``, in float32 before the cast
    back, as Gemma's reference does (the others cast first, then scale by the weight)."""

    def __init__(self, hidden_size: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and cast back before the weight, like the reference models.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.unit_offset:
            return (xf * (1.0 + self.weight.float())).to(dtype)
        return self.weight * xf.to(dtype)


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class CausalLM(nn.Module):
    """What every model class shares: a head on the final hidden states. A causal LM has an
    ``lm_head`` whose logits the engine samples from (it calls forward(...) for hidden states,
    then compute_logits on the sampled rows); a ``*ForSequenceClassification`` checkpoint has a
    ``score`` head instead, read by ``classify`` on each sequence's last token."""

    # (Set by make_head: a class-level None would shadow the registered submodules.)
    lm_head: Optional[nn.Module]
    score: Optional[nn.Module]
    # Gemma 2: logits squashed into (-cap, cap) as ``cap * tanh(logits / cap)``; 0: none.
    final_logit_softcap: float = 0.0

    def make_head(self, cfg: Any, in_features: int, embedding: nn.Module) -> None:
        """lm_head (tied to ``embedding`` when the config says so), or the classifier's score."""
        self.lm_head = self.score = None
        if cfg.is_classifier:
            self.score = Linear(in_features, cfg.num_labels, bias=False)
            return
        self.lm_head = Linear(in_features, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = embedding.weight

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], float32 unless ``upcast=False`` (then the
        model's dtype: enough for an argmax, and no [N, vocab] float32 copy)."""
        if self.lm_head is None:
            raise ValueError(f"{self.config.architecture} is a sequence classifier: it scores "
                             "sequences (classify) and does not generate text")
        logits = self.lm_head(hidden)
        logits = logits.float() if upcast else logits
        if self.final_logit_softcap:
            logits = torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap
        return logits

    @torch.inference_mode()
    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states of each sequence's last token [N, hidden] -> float32 class
        logits [N, num_labels] (HF's ``*ForSequenceClassification`` logits)."""
        if self.score is None:
            raise ValueError(f"{self.config.architecture} has no classification head; load a "
                             "*ForSequenceClassification checkpoint")
        return self.score(hidden).float()


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# (checkpoint name fragment, our fused parameter fragment, shard index)
FusedMapping = list[tuple[str, str, int]]


def load_weights_into(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                      fused: FusedMapping, shard_sizes: Callable[[str], list[int]],
                      rename: Callable[[str], str | None] = lambda n: n) -> set[str]:
    """Copies checkpoint tensors into ``module``'s parameters, slicing the separate q/k/v (or
    gate/up) tensors of a checkpoint into our fused ones. Returns the parameter names that were
    written; raises on unknown names and shape mismatches."""
    params = dict(module.named_parameters())
    written: set[str] = set()
    for ckpt_name, tensor in weights:
        name = rename(ckpt_name)
        if name is None:
            continue
        target, shard = name, None
        for src, dst, idx in fused:
            if src in name:
                target, shard = name.replace(src, dst), idx
                break
        if target not in params:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} has no place in the model "
                             f"(looked for {target!r})")
        param = params[target]
        dst_tensor = param.data
        if shard is not None:
            sizes = shard_sizes(target)
            start = sum(sizes[:shard])
            dst_tensor = dst_tensor.narrow(0, start, sizes[shard])
        if tuple(dst_tensor.shape) != tuple(tensor.shape):
            raise ValueError(f"checkpoint tensor {ckpt_name!r} has shape {tuple(tensor.shape)}, "
                             f"expected {tuple(dst_tensor.shape)}")
        with torch.no_grad():
            dst_tensor.copy_(tensor.to(dst_tensor.dtype))
        written.add(target if shard is None else f"{target}#{shard}")
    return written


def check_all_loaded(module: nn.Module, written: set[str],
                     fused_targets: dict[str, int]) -> None:
    """Raises when a parameter got no checkpoint data (a fused one needs all its shards)."""
    missing = []
    for name, _ in module.named_parameters():
        parts = next((n for frag, n in fused_targets.items() if frag in name), 0)
        if parts:
            if any(f"{name}#{i}" not in written for i in range(parts)):
                missing.append(name)
        elif name not in written:
            missing.append(name)
    if missing:
        raise ValueError(f"checkpoint is missing weights for {len(missing)} parameters, "
                         f"e.g. {missing[:4]}")
