"""The per-step cost structure of LoRALinear's kernels, counted with torch.profiler on the CPU
(the same ops launch as CUDA kernels on a GPU): what every layer derives from the step's slots
(the grouping by slot of grouped_mm, the one-hot slot mask of dense) is computed once per
forward for all layers, and each layer adds only its own few ops (dense: one shrink GEMM, one
mask multiply, one in-place expand GEMM; no copies, concatenations or fp32 round trips)."""

from __future__ import annotations

from collections import Counter

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.models.linear import MergedColumnParallelLinear, QKVParallelLinear  # noqa: E402
from pagedkv.models.lora import LoRALinear, LoRAStep  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

MAX_LORAS, MAX_RANK, TOKENS, LAYERS = 4, 8, 24, 3
# Ops that only make a view (no kernel launch, no copy).
VIEWS = {"aten::reshape", "aten::view", "aten::slice", "aten::t", "aten::unsqueeze"}
VIEWS |= {"aten::transpose", "aten::as_strided", "aten::select", "aten::expand"}


def _layers(kernel: str, step: LoRAStep) -> list[LoRALinear]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(LAYERS):
        if i % 2:
            base, sizes = MergedColumnParallelLinear(32, [48, 48]), [48, 48]
        else:
            base, sizes = QKVParallelLinear(32, 8, 4, 2), [32, 16, 16]
        with torch.no_grad():
            for p in base.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        names = [f"s{j}" for j in range(len(sizes))]
        layer = LoRALinear(base, names, sizes, MAX_LORAS, MAX_RANK, step, kernel)
        for slot in range(MAX_LORAS):
            parts = {
                j: (torch.randn(4, 32, generator=g), torch.randn(n, 4, generator=g))
                for j, n in enumerate(sizes)
            }
            layer.set_slot(slot, parts)
        out.append(layer)
    return out


def _op_counts(kernel: str) -> Counter:
    """aten ops called by one forward of LAYERS layers that share a step, minus the base
    linears' own ops."""
    step = LoRAStep(MAX_LORAS)
    layers = _layers(kernel, step)
    x = torch.randn(TOKENS, 32, generator=torch.Generator().manual_seed(1))
    slots = torch.arange(TOKENS, dtype=torch.int32) % (MAX_LORAS + 1) - 1

    def counts(with_lora: bool) -> Counter:
        step.token_lora_indices = slots if with_lora else None
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for layer in layers:
                layer(x)
        top = [e.name for e in prof.events() if e.cpu_parent is None]
        return Counter(n for n in top if n.startswith("aten::") and n not in VIEWS)

    return counts(True) - counts(False)


def test_dense_ops_per_layer_and_one_mask_per_step() -> None:
    # per layer: the shrink GEMM, the slot mask multiplied in place, the expand GEMM added into
    # the base output in place; per forward: the mask (arange, eq, to), shared by every layer
    # (the base linears' own GEMMs are subtracted). Nothing else: no cat, zeros, copies.
    per_step = {"aten::arange": 1, "aten::eq": 1, "aten::to": 1}
    per_layer = {"aten::mm": LAYERS, "aten::mul_": LAYERS, "aten::addmm_": LAYERS}
    assert _op_counts("dense") == Counter({**per_step, **per_layer})


def test_grouped_mm_sorts_once_per_step() -> None:
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no torch._grouped_mm")
    ops = _op_counts("grouped_mm")
    assert ops["aten::sort"] == 1 and ops["aten::searchsorted"] == 1
    assert ops["aten::_grouped_mm"] == 2 * LAYERS
