"""Small building blocks shared by the model files, and the fused-weight loading helper."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Union, overload

import torch
import torch.nn.functional as F
from torch import nn

from pagedkv import ops

# dtypes and devices the fused ops take; anything else (float64, meta, mps) runs the eager math.
_FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def fused_ok(x: torch.Tensor) -> bool:
    """The fused ops take x: a float32 / float16 / bfloat16 CPU or CUDA array of rank 1 to 3
    with a contiguous last dimension (the ops' rows); the eager math serves anything else."""
    return (
        x.dtype in _FUSED_DTYPES
        and x.device.type in ("cpu", "cuda")
        and 1 <= x.dim() <= 3
        and (x.stride(-1) == 1 or x.shape[-1] == 1)
    )


# Inference-only layers: parameters start uninitialised (torch.empty) because every one of them
# is overwritten by the checkpoint; torch.nn's random init of a 1B model costs seconds.


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = (
            nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine else None
        )
        self.bias = nn.Parameter(torch.empty(hidden_size), requires_grad=False) if affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension through the fused ops (pagedkv.ops.rms_norm /
    fused_add_rms_norm). ``weight_offset=1.0`` is Gemma's ``1 + w`` form (whose product is
    rounded once, as HF Gemma does). Inputs of rank 1 to 3 (per-head q/k norms: [T, H, D]).

    ``norm(x)`` returns a new normalised tensor; ``norm(x, residual)`` is the fused residual
    step: ``residual += x`` and x normalised, both in place, returned as (x, residual).
    """

    def __init__(self, hidden_size: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: Optional[torch.Tensor] = None
    ) -> Union[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        fused = fused_ok(x) and self.weight.dtype == x.dtype
        if residual is not None:
            if fused and residual.dtype == x.dtype:
                ops.fused_add_rms_norm(
                    x, residual, self.weight, self.eps, weight_offset=self.weight_offset
                )
                return x, residual
            residual.add_(x)
            return self._eager(residual), residual
        if fused:
            out = torch.empty_like(x)
            ops.rms_norm(out, x, self.weight, self.eps, weight_offset=self.weight_offset)
            return out
        return self._eager(x)

    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, like the reference models (Llama: cast back before the weight;
        # Gemma: the offset weight applied in float32).
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_offset:
            return (xf * (self.weight_offset + self.weight.float())).to(dtype)
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

    config: Any  # the ModelConfig
    # (Set by make_head: a class-level None would shadow the registered submodules.)
    lm_head: Optional[nn.Module]
    score: Optional[nn.Module]
    # Gemma 2: logits squashed into (-cap, cap) as ``cap * tanh(logits / cap)``; 0: none.
    final_logit_softcap: float = 0.0
    # For pooling (engine/pooler.py): the tokens the model pools by default, and whether its
    # attention is causal (an encoder's is not: no chunked prefill, no prefix cache).
    pooling_type: str = "LAST"
    is_causal: bool = True

    def make_head(self, cfg: Any, in_features: int, embedding: nn.Module) -> None:
        """lm_head (tied to ``embedding`` when the config says so, on a stage that has both),
        or the classifier's score; only the last pipeline stage has one."""
        from pagedkv.models.linear import ReplicatedLinear
        from pagedkv.models.pipeline_stage import is_first_stage, is_last_stage, last_stage_only
        from pagedkv.models.vocab_embedding import ParallelLMHead

        self.lm_head = self.score = None
        if cfg.is_base_model:  # a bare decoder: hidden states only (pooling)
            return
        if cfg.is_classifier:
            self.score = last_stage_only(
                lambda: ReplicatedLinear(in_features, cfg.num_labels, bias=False)
            )
            return
        self.lm_head = last_stage_only(lambda: ParallelLMHead(cfg.vocab_size, in_features))
        if cfg.tie_word_embeddings and is_first_stage() and is_last_stage():
            self.lm_head.weight = embedding.weight

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab], float32 unless ``upcast=False`` (then the
        model's dtype: enough for an argmax, and no [N, vocab] float32 copy)."""
        if self.lm_head is None:
            what = (
                "a bare model without a language-model head: it embeds text"
                if self.config.is_base_model
                else "a sequence classifier: it scores sequences (classify)"
            )
            raise ValueError(f"{self.config.architecture} is {what} and does not generate text")
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
            raise ValueError(
                f"{self.config.architecture} has no classification head; load a "
                "*ForSequenceClassification checkpoint"
            )
        return self.score(hidden).float()


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act {name!r} is not supported; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


# hidden_act -> the fused gated op computing act(gate) * up.
_GATED_OPS: dict[str, Callable[..., None]] = {
    "silu": ops.silu_and_mul,
    "swish": ops.silu_and_mul,
    "gelu": ops.gelu_and_mul,
    "gelu_new": ops.gelu_tanh_and_mul,
    "gelu_pytorch_tanh": ops.gelu_tanh_and_mul,
}


def act_and_mul(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """x [..., 2d] (a fused gate | up projection) -> act(x[..., :d]) * x[..., d:] [..., d]: the
    fused op where there is one for `name` (relu has none: eager math), like HF's
    ``act(gate) * up``."""
    act = activation(name)
    fused_op = _GATED_OPS.get(name)

    def gated(x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        if fused_op is not None and fused_ok(x):
            out = torch.empty(*x.shape[:-1], d, dtype=x.dtype, device=x.device)
            fused_op(out, x)
            return out
        gate, up = x.split(d, dim=-1)
        return act(gate) * up

    return gated


# (checkpoint name fragment, our fused parameter fragment, shard index)
FusedMapping = list[tuple[str, str, int]]


def load_weights_into(
    module: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    fused: FusedMapping,
    shard_sizes: Optional[Callable[[str], list[int]]] = None,
    rename: Callable[[str], str | None] = lambda n: n,
) -> set[str]:
    """Copies checkpoint tensors into ``module``'s parameters. A checkpoint's separate q/k/v
    (or gate/up) tensors go into our fused parameter as its parts (``fused``). A parameter with
    a ``weight_loader`` (the tensor-parallel layers of linear.py / vocab_embedding.py) takes its
    rank's slice itself; a plain one gets the whole tensor (or the part ``shard_sizes`` places).
    Tensors of layers on other pipeline stages are skipped. Returns the parameter names that
    were written; raises on unknown names and shape mismatches."""
    from pagedkv.models.linear import default_weight_loader
    from pagedkv.models.pipeline_stage import other_stage_prefixes

    params = dict(module.named_parameters())
    elsewhere = other_stage_prefixes(module)
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
            if elsewhere and target.startswith(elsewhere):
                continue  # another pipeline stage holds it
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} has no place in the model (looked for {target!r})"
            )
        param = params[target]
        loader = getattr(param, "weight_loader", None)
        try:
            if loader is not None:
                loader(param, tensor, shard)
            elif shard is None:
                default_weight_loader(param, tensor)
            else:
                _load_part(param, tensor, shard, shard_sizes, target)
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} {e}") from None
        written.add(target if shard is None else f"{target}#{shard}")
    return written


def _load_part(
    param: torch.Tensor,
    tensor: torch.Tensor,
    shard: int,
    shard_sizes: Optional[Callable[[str], list[int]]],
    target: str,
) -> None:
    """Part ``shard`` of a plain fused parameter, placed by ``shard_sizes`` (one rank only)."""
    from pagedkv.models.linear import copy_checked

    if shard_sizes is None:
        raise ValueError(
            f"is a part of {target!r}, which has no weight_loader and no shard_sizes were given"
        )
    sizes = shard_sizes(target)
    copy_checked(param.data.narrow(0, sum(sizes[:shard]), sizes[shard]), tensor)


def check_all_loaded(module: nn.Module, written: set[str], fused_targets: dict[str, int]) -> None:
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
        raise ValueError(
            f"checkpoint is missing weights for {len(missing)} parameters, e.g. {missing[:4]}"
        )
