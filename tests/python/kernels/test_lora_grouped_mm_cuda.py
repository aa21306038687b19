"""LoRALinear's grouped_mm (torch._grouped_mm, bf16 on Hopper), dense and pagedkv_tiled kernels
on the GPU: captured in a CUDA graph that reads the tokens' slots from a buffer, replays with new
slots (the sort and group offsets, or the slot mask, are recomputed on the device) equal the
float64 reference and the core's BGMV ops; grouped_mm is refused by name where torch would fall
back to a host-syncing loop."""

from __future__ import annotations

from typing import Any

import pytest
from support.deps import need
from support.lora_reference import lora_linear_ref

torch = need("torch")

from pagedkv.models.linear import MergedColumnParallelLinear, QKVParallelLinear  # noqa: E402
from pagedkv.models.lora import LoRALinear, LoRAStep  # noqa: E402

pytestmark = pytest.mark.cuda

MAX_LORAS, MAX_RANK, TOKENS = 3, 16, 40


def _hopper() -> bool:
    return (
        torch.cuda.is_available()
        and hasattr(torch, "_grouped_mm")
        and torch.cuda.get_device_capability() >= (9, 0)
    )


def _np(t: Any) -> Any:
    return None if t is None else t.detach().cpu().double().numpy()


def _layer(kind: str, g: torch.Generator) -> tuple[torch.nn.Module, list[int]]:
    layer: torch.nn.Module
    if kind == "qkv":  # 8 query heads, 2 KV heads of 16
        layer, sizes = QKVParallelLinear(128, 16, 8, 2), [128, 32, 32]
    else:
        layer, sizes = MergedColumnParallelLinear(128, [192, 192]), [192, 192]
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 8)
    return layer.to("cuda", torch.bfloat16), sizes


def _slots(layers: list[LoRALinear], sizes: list[int], g: torch.Generator) -> list[dict]:
    adapters = []
    for slot in range(MAX_LORAS):
        r = (4, 16, 8)[slot]
        parts = {
            i: (
                (torch.randn(r, 128, generator=g) / 11).to("cuda", torch.bfloat16),
                (torch.randn(sizes[i], r, generator=g) / 4).to("cuda", torch.bfloat16),
            )
            for i in range(len(sizes))
            if slot != 2 or i != 1  # slot 2 leaves one slice out
        }
        for layer in layers:
            layer.set_slot(slot, parts)
        adapters.append({i: (_np(a), _np(b)) for i, (a, b) in parts.items()})
    return adapters


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("kernel", ["grouped_mm", "dense", "pagedkv_tiled"])
@pytest.mark.parametrize("kind", ["qkv", "gate_up"])
def test_graph_replay_with_new_slots(kind: str, kernel: str) -> None:
    if kernel == "grouped_mm" and not _hopper():
        pytest.skip("torch._grouped_mm's fast path needs sm90+")
    g = torch.Generator().manual_seed(3)
    base, sizes = _layer(kind, g)
    names = [f"s{i}" for i in range(len(sizes))]
    step = LoRAStep(MAX_LORAS)
    layer = LoRALinear(base, names, sizes, MAX_LORAS, MAX_RANK, step, kernel)
    core = LoRALinear(base, names, sizes, MAX_LORAS, MAX_RANK, LoRAStep(MAX_LORAS), "pagedkv")
    adapters = _slots([layer, core], sizes, g)
    x = (torch.randn(TOKENS, 128, generator=g)).to("cuda", torch.bfloat16)
    slots = torch.zeros(TOKENS, dtype=torch.int32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step.token_lora_indices = slots
        layer(x)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step.token_lora_indices = slots  # the grouping is computed inside the capture
        out = layer(x)
    for pattern in ("mixed", "one", "none"):
        if pattern == "mixed":
            new = torch.randint(-1, MAX_LORAS, (TOKENS,), generator=g, dtype=torch.int32)
        else:
            new = torch.full((TOKENS,), 1 if pattern == "one" else -1, dtype=torch.int32)
        slots.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want = lora_linear_ref(
            _np(base.weight), _np(base.bias), _np(x), adapters, new.numpy(), sizes
        )
        scale = float(abs(want).max())
        err = float(abs(_np(out) - want).max()) / scale
        assert err < 2e-2, (pattern, err)
        core.step.token_lora_indices = slots
        agree = float((out.float() - core(x).float()).abs().max()) / scale
        assert agree < 2e-2, (pattern, agree)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_grouped_mm_refused_off_its_fast_path() -> None:
    base = QKVParallelLinear(128, 16, 8, 2).to("cuda", torch.float32)
    with pytest.raises(ValueError, match="grouped_mm' on CUDA needs bfloat16"):
        LoRALinear(base, ["q", "k", "v"], [128, 32, 32], 2, 16, LoRAStep(2), "grouped_mm")
    auto = LoRALinear(base, ["q", "k", "v"], [128, 32, 32], 2, 16, LoRAStep(2), "auto")
    assert auto.kernel == "pagedkv"
