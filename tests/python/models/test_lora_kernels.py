"""LoRALinear's kernels on the CPU: "grouped_mm" (torch._grouped_mm over the tokens sorted by
slot), "pagedkv" (the core's BGMV ops; "pagedkv_tiled" differs on CUDA only) and "dense" (all
slots' GEMMs under the step's one-hot slot mask, the expand added in place) all equal a float64
reference built from the adapters' own A/B matrices, for plain, QKV and gate/up layers; with
tokens without an adapter, one slot, all slots, ranks below max_rank and slices an adapter
does not target."""

from __future__ import annotations

from typing import Any

import pytest
from support.deps import need
from support.lora_reference import lora_linear_ref

torch = need("torch")

from pagedkv.engine.config import EngineConfig  # noqa: E402
from pagedkv.models.linear import (  # noqa: E402
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from pagedkv.models.lora import LoRALinear, LoRAStep, auto_kernel  # noqa: E402

if not hasattr(torch, "_grouped_mm"):
    pytest.skip("this torch has no torch._grouped_mm", allow_module_level=True)

MAX_RANK = 8


def _base(kind: str, g: torch.Generator) -> tuple[torch.nn.Module, list[int]]:
    layer: torch.nn.Module
    if kind == "qkv":  # 4 query heads, 2 KV heads of 8: slices 32, 16, 16
        layer, sizes = QKVParallelLinear(24, 8, 4, 2), [32, 16, 16]
    elif kind == "gate_up":
        layer, sizes = MergedColumnParallelLinear(24, [40, 40]), [40, 40]
    elif kind == "column":
        layer, sizes = ColumnParallelLinear(24, 56), [56]
    else:
        layer, sizes = RowParallelLinear(40, 24), [24]
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return layer, sizes


def _adapters(
    sizes: list[int], fin: int, max_loras: int, g: torch.Generator
) -> list[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Per slot: its rank (1..MAX_RANK) and the slices it targets (slot 0: all of them)."""
    out = []
    for slot in range(max_loras):
        r = 1 + (3 * slot + 2) % MAX_RANK
        slices = range(len(sizes)) if slot == 0 else range(slot % len(sizes), len(sizes), 2)
        out.append(
            {
                i: (torch.randn(r, fin, generator=g), torch.randn(sizes[i], r, generator=g))
                for i in slices
            }
        )
    return out


def _np(t: Any) -> Any:
    return None if t is None else t.detach().double().numpy()


def _reference(
    layer: torch.nn.Module,
    x: torch.Tensor,
    adapters: list[dict[int, tuple[torch.Tensor, torch.Tensor]]],
    idx: torch.Tensor,
    sizes: list[int],
) -> torch.Tensor:
    parts = [{i: (_np(a), _np(b)) for i, (a, b) in ad.items()} for ad in adapters]
    want = lora_linear_ref(_np(layer.weight), _np(layer.bias), _np(x), parts, idx.numpy(), sizes)
    return torch.from_numpy(want)


CASES = [  # layer kind, tokens, max_loras, slot pattern
    ("qkv", 13, 3, "mixed"),
    ("gate_up", 9, 2, "mixed"),
    ("column", 1, 1, "one"),
    ("row", 17, 4, "all"),
    ("qkv", 6, 4, "none"),
    ("gate_up", 11, 3, "one"),
]


def _indices(pattern: str, t: int, max_loras: int, g: torch.Generator) -> torch.Tensor:
    if pattern == "one":  # every token in the last slot
        return torch.full((t,), max_loras - 1, dtype=torch.int32)
    if pattern == "all":  # every slot used, no token without an adapter
        return torch.arange(t, dtype=torch.int32).flip(0) % max_loras
    if pattern == "none":  # adapters enabled, but no token of the step has one
        return torch.full((t,), -1, dtype=torch.int32)
    return torch.randint(-1, max_loras, (t,), generator=g, dtype=torch.int32)


@pytest.mark.parametrize("case", CASES)
def test_kernels_equal_float64_reference(case: tuple) -> None:
    kind, t, max_loras, pattern = case
    g = torch.Generator().manual_seed(t * 7 + max_loras)
    base, sizes = _base(kind, g)
    fin = int(base.weight.shape[1])
    names = [f"s{i}" for i in range(len(sizes))]
    adapters = _adapters(sizes, fin, max_loras, g)
    x = torch.randn(t, fin, generator=g)
    idx = _indices(pattern, t, max_loras, g)
    want = _reference(base, x, adapters, idx, sizes)
    got = {}
    for kernel in ("grouped_mm", "pagedkv", "pagedkv_tiled", "dense"):
        step = LoRAStep(max_loras)
        layer = LoRALinear(base, names, sizes, max_loras, MAX_RANK, step, kernel)
        assert layer.kernel == kernel
        for slot, parts in enumerate(adapters):
            layer.set_slot(slot, parts)
        step.token_lora_indices = idx
        got[kernel] = layer(x)
        torch.testing.assert_close(got[kernel].double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got["grouped_mm"], got["pagedkv"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["dense"], got["pagedkv"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["pagedkv_tiled"], got["pagedkv"], rtol=0, atol=0)


@pytest.mark.parametrize("kernel", ["grouped_mm", "dense"])
def test_groups_follow_new_indices_in_place(kernel: str) -> None:
    """A CUDA graph's capture sets the same slot buffer before its warm-up and its captured
    forward, and a replay reads new slots written in place: the grouping and the slot mask
    are recomputed after each assignment, never kept from the previous forward."""
    g = torch.Generator().manual_seed(5)
    base, sizes = _base("qkv", g)
    adapters = _adapters(sizes, 24, 3, g)
    step = LoRAStep(3)
    layer = LoRALinear(base, ["q", "k", "v"], sizes, 3, MAX_RANK, step, kernel)
    for slot, parts in enumerate(adapters):
        layer.set_slot(slot, parts)
    x = torch.randn(7, 24, generator=g)
    buffer = torch.tensor([0, 1, 2, -1, 0, 1, 2], dtype=torch.int32)
    for rows in ([0, 1, 2, -1, 0, 1, 2], [2, 2, -1, 1, 0, 0, 1]):
        buffer.copy_(torch.tensor(rows, dtype=torch.int32))
        step.token_lora_indices = buffer
        want = _reference(base, x, adapters, buffer, sizes)
        torch.testing.assert_close(layer(x).double(), want, rtol=1e-4, atol=1e-4)
        order, offs = step.groups()
        assert offs.dtype == torch.int32 and offs.tolist()[-1] == 7
        assert sorted(order.tolist()) == list(range(7))
        mask = step.slot_mask(torch.float32)[:, :, 0]
        assert mask.tolist() == [[float(r == s) for s in range(3)] for r in rows]


def test_clear_slot_and_refusals() -> None:
    g = torch.Generator().manual_seed(1)
    base, sizes = _base("gate_up", g)
    step = LoRAStep(2)
    layer = LoRALinear(base, ["gate", "up"], sizes, 2, MAX_RANK, step, "grouped_mm")
    layer.set_slot(1, _adapters(sizes, 24, 2, g)[0])
    layer.clear_slot(1)
    x = torch.randn(3, 24, generator=g)
    step.token_lora_indices = torch.ones(3, dtype=torch.int32)
    torch.testing.assert_close(layer(x), base(x))
    with pytest.raises(ValueError, match="slot 2 is out of range"):
        layer.set_slot(2, {})  # the extra slot of tokens without an adapter stays zero
    with pytest.raises(ValueError, match="LoRA kernel must be one of"):
        LoRALinear(base, ["gate", "up"], sizes, 2, MAX_RANK, step, "sgmv")
    with pytest.raises(ValueError, match="lora_kernel must be one of"):
        EngineConfig(lora_kernel="sgmv").validate()


class _Weight:
    """A layer weight as auto_kernel reads it (shape, device kind, dtype), without a GPU."""

    def __init__(self, out: int, inp: int, cuda: bool) -> None:
        self.shape, self.is_cuda, self.dtype = (out, inp), cuda, torch.float32


@pytest.mark.parametrize(
    "out,inp,cuda,max_loras,want",
    [
        (2048, 2048, True, 8, "dense"),  # 8 rank-16 slots: 12.5 % more bytes (measured: dense)
        (3072, 2048, True, 8, "dense"),  # a 1B qkv_proj's 3 x 16 ranks: 31 % (measured: dense)
        (2048, 2048, True, 64, "pagedkv"),  # 100 % more: the per-token kernels
        (2048, 2048, False, 1, "pagedkv"),  # the CPU keeps the core's kernels
        (192, 128, True, 4, "pagedkv"),  # a tiny layer: the slots outweigh it
    ],
)
def test_auto_kernel_rule(out: int, inp: int, cuda: bool, max_loras: int, want: str) -> None:
    ranks = 48 if out == 3072 else 16
    assert auto_kernel(_Weight(out, inp, cuda), ranks, max_loras) == want  # type: ignore[arg-type]
