"""One LoRA layer's cost on the GPU, by kernel: the base linear alone vs LoRALinear with its
adapters' deltas through "dense" (all slots' GEMMs under a one-hot slot mask), "grouped_mm"
(torch._grouped_mm SGMV), "pagedkv" (the core's BGMV) and "pagedkv_tiled" (its tiled variant),
each replayed from a CUDA graph (as decode steps run), for the random 1B Llama's layer shapes
and tokens spread over 8 rank-16 adapters. Each replay here also recomputes what the step
derives from the slots (dense's slot mask, grouped_mm's sort by slot), which the engine does
once per forward for all layers: a few small kernels per row that an engine step amortises.

  python benchmarks/lora_ops_bench.py --json lora_ops.json
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
from pagedkv.models.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from pagedkv.models.lora import LoRALinear, LoRAStep

# The random 1B Llama (pagedkv.testing's "llama-1b"): hidden 2048, 32 heads of 64, 8 KV heads,
# intermediate 8192.
LAYERS = {
    "qkv_proj": (lambda: QKVParallelLinear(2048, 64, 32, 8, bias=False), [2048, 512, 512]),
    "o_proj": (lambda: RowParallelLinear(2048, 2048, bias=False), [2048]),
    "gate_up_proj": (
        lambda: MergedColumnParallelLinear(2048, [8192, 8192], bias=False),
        [8192, 8192],
    ),
    "down_proj": (lambda: RowParallelLinear(8192, 2048, bias=False), [2048]),
}


def _graph_us(fn: Callable[[], torch.Tensor], iters: int) -> float:
    """Microseconds per replay of ``fn`` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    for _ in range(10):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iters


def _layer_us(layer: torch.nn.Module, x: torch.Tensor, slots, iters: int) -> float:
    def fwd() -> torch.Tensor:
        if slots is not None:  # set before each forward: the grouping runs inside the capture
            layer.step.token_lora_indices = slots
        return layer(x)

    return _graph_us(fwd, iters)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--num-adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev, dt, loras = "cuda", torch.bfloat16, args.num_adapters
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, (make, sizes) in LAYERS.items():
        base = make().to(dev, dt)
        with torch.no_grad():
            for p in base.parameters():
                p.normal_(0, 0.02)
        fin = int(base.weight.shape[1])
        names = [f"s{i}" for i in range(len(sizes))]
        layers = {}
        for kernel in ("dense", "grouped_mm", "pagedkv", "pagedkv_tiled"):
            layer = LoRALinear(base, names, sizes, loras, args.rank, LoRAStep(loras), kernel)
            for slot in range(loras):
                parts = {
                    i: (
                        torch.randn(args.rank, fin, generator=g).to(dev, dt) / fin**0.5,
                        torch.randn(size, args.rank, generator=g).to(dev, dt) * 0.01,
                    )
                    for i, size in enumerate(sizes)
                }
                layer.set_slot(slot, parts)
            layers[kernel] = layer
        for t in args.tokens:
            x = torch.randn(t, fin, generator=g).to(dev, dt)
            slots = (torch.arange(t, dtype=torch.int32) % loras).to(dev)
            row = {"layer": name, "tokens": t, "base_us": _layer_us(base, x, None, args.iters)}
            for kernel, layer in layers.items():
                row[f"{kernel}_us"] = _layer_us(layer, x, slots, args.iters)
            print(json.dumps(row), flush=True)
            rows.append(row)
    result = {"rows": rows, "device": torch.cuda.get_device_name(), "rank": args.rank}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
