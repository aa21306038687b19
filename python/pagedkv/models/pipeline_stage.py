"""What a model builds on one pipeline stage: its contiguous range of decoder layers.

Layers of other stages are PPMissingLayer placeholders (no parameters), so module names keep
the checkpoint's global layer numbers and the loader skips the other stages' tensors. With one
stage every layer is built.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Tuple

import torch
from torch import nn

from pagedkv.distributed import get_pp_group, pp_layer_range


class PPMissingLayer(nn.Identity):
    """Stands for a module that lives on another pipeline stage."""


def stage_layers(
    num_layers: int, build: Callable[[int, int], nn.Module]
) -> Tuple[nn.ModuleList, int, int]:
    """(layers, start, end): ``build(global_index, cache_index)`` for this stage's layers,
    where ``cache_index = global_index - start`` is the layer's KV cache on this rank."""
    start, end = pp_layer_range(num_layers)
    layers = nn.ModuleList(
        build(i, i - start) if start <= i < end else PPMissingLayer() for i in range(num_layers)
    )
    return layers, start, end


def is_first_stage() -> bool:
    return get_pp_group().is_first_rank


def is_last_stage() -> bool:
    return get_pp_group().is_last_rank


def first_stage_only(build: Callable[[], nn.Module]) -> nn.Module:
    """build() on the first stage (the embeddings), a placeholder on the others."""
    return build() if is_first_stage() else PPMissingLayer()


def last_stage_only(build: Callable[[], nn.Module]) -> nn.Module:
    """build() on the last stage (the final norm, the head), a placeholder on the others."""
    return build() if is_last_stage() else PPMissingLayer()


def other_stage_prefixes(module: nn.Module) -> Tuple[str, ...]:
    """Name prefixes (``"model.layers.7."``) of the modules that live on other stages."""
    return tuple(
        f"{name}." for name, sub in module.named_modules() if isinstance(sub, PPMissingLayer)
    )


def stage_start(
    embed: Callable[[], torch.Tensor], intermediate: Optional[torch.Tensor]
) -> torch.Tensor:
    """The hidden states this stage starts from: embed() on the first stage, the previous
    stage's output on the others."""
    return embed() if is_first_stage() else stage_input(intermediate, "hidden states")


def run_stage(
    embed: Callable[[], torch.Tensor],
    intermediate: Optional[torch.Tensor],
    layers: Iterable[nn.Module],
    run_layer: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    finish: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One stage's forward for a model whose layers map hidden states to hidden states
    (GPT-2, GPT-NeoX, OPT): its input (stage_start), this stage's ``layers`` in order, then
    finish() (the final norm) on the last stage; a stage before the last hands its hidden
    states on as they are. Llama's layers carry a residual stream beside them: its loop is its
    own."""
    x = stage_start(embed, intermediate)
    for layer in layers:
        x = run_layer(layer, x)
    return finish(x) if is_last_stage() else x


def stage_input(intermediate: torch.Tensor | None, what: str) -> torch.Tensor:
    """The hidden states a non-first stage starts from (sent by the previous stage)."""
    if intermediate is None:
        raise ValueError(
            f"pipeline stage {get_pp_group().rank_in_group} needs the previous stage's {what}"
        )
    return intermediate
