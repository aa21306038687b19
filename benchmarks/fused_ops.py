"""The fused layer ops (pagedkv.ops: rms_norm, fused_add_rms_norm, rotary_embedding,
silu_and_mul, gelu_tanh_and_mul) against torch eager and ``torch.compile`` of the same math, and
against the card's copy bandwidth. One run prints one markdown table.

    python benchmarks/fused_ops.py [--quick] [--json PATH]

Shapes of a Llama-3.2-1B-like (hidden 2048, 32 / 8 heads of 64, MLP 8192) and a Llama-3-8B-like
model (4096, 32 / 8 heads of 128, MLP 14336), bf16, at a decode batch (256 tokens; both
models) and a prefill chunk (4096 tokens; 8B). Every variant is timed as CUDA-graph replays of
20 calls (the engine captures decode in graphs, so launch latency is out of every column),
median of 30 replays.
"bw" is the op's compulsory bytes (each input read once, each output written once) per second
as a fraction of a device-to-device copy's read + write rate. A second table times the
sampler's steps: the top-k / top-p truncation (the radix-search threshold op against a
vocabulary sort) and the draw (the race op against a torch noise array + argmax).
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from pagedkv import ops

DTYPE = torch.bfloat16
CALLS = 20
MODELS = {"1B": (2048, 32, 8, 64, 8192), "8B": (4096, 32, 8, 128, 14336)}


def time_graph(fn: Callable[[], object], reps: int = 30) -> float:
    """Seconds per call of fn, from CUDA-graph replays of CALLS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up (and torch.compile's compilation) outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / CALLS)
    return statistics.median(times)


def copy_bandwidth() -> float:
    a = torch.empty(1 << 28, dtype=DTYPE, device="cuda").normal_()
    b = torch.empty_like(a)
    return 2 * a.numel() * a.element_size() / time_graph(lambda: b.copy_(a), reps=10)


# ---- the eager math the fused ops replace (as the models computed it) ----------------------


def eager_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def eager_add_rms_norm(
    x: torch.Tensor, r: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r = x + r
    return eager_rms_norm(r, w), r


def eager_rotary(
    pos: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    half = cache.shape[1] // 2
    cs = cache[pos]
    cos, sin = cs[:, None, :half], cs[:, None, half:]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rot(q), rot(k)


def eager_silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def eager_gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


_EAGER = (
    eager_rms_norm,
    eager_add_rms_norm,
    eager_rotary,
    eager_silu_and_mul,
    eager_gelu_tanh_and_mul,
)
# One compiled function per op, shared by the shapes (torch.compile specialises per shape).
compiled = {f: torch.compile(f) for f in _EAGER}


def cases(tokens: int, model: str) -> list[tuple[str, int, Callable, Callable, Callable]]:
    """(op, bytes, fused call, eager call, the eager math's callable to compile)."""
    hidden, hq, hk, d, inter = MODELS[model]
    es = torch.finfo(DTYPE).bits // 8
    x = torch.randn(tokens, hidden, dtype=DTYPE, device="cuda")
    r = torch.randn_like(x)
    out = torch.empty_like(x)
    w = torch.rand(hidden, dtype=DTYPE, device="cuda")
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=DTYPE, device="cuda")
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    pos = torch.randint(0, 4096, (tokens,), device="cuda")
    inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, device="cuda").float() / d)
    freqs = torch.outer(torch.arange(8192, device="cuda").float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], 1).to(DTYPE).contiguous()
    gu = torch.randn(tokens, 2 * inter, dtype=DTYPE, device="cuda")
    act = torch.empty(tokens, inter, dtype=DTYPE, device="cuda")
    n, qk = tokens * hidden * es, tokens * (hq + hk) * d * es
    return [
        (
            "rms_norm",
            2 * n,
            lambda: ops.rms_norm(out, x, w, 1e-6),
            lambda: eager_rms_norm(x, w),
            lambda: compiled[eager_rms_norm](x, w),
        ),
        (
            "fused_add_rms_norm",
            4 * n,
            lambda: ops.fused_add_rms_norm(x, r, w, 1e-6),
            lambda: eager_add_rms_norm(x, r, w),
            lambda: compiled[eager_add_rms_norm](x, r, w),
        ),
        (
            "rotary_embedding",
            2 * qk,
            lambda: ops.rotary_embedding(pos, q, k, d, cache),
            lambda: eager_rotary(pos, q, k, cache),
            lambda: compiled[eager_rotary](pos, q, k, cache),
        ),
        (
            "silu_and_mul",
            3 * tokens * inter * es,
            lambda: ops.silu_and_mul(act, gu),
            lambda: eager_silu_and_mul(gu),
            lambda: compiled[eager_silu_and_mul](gu),
        ),
        (
            "gelu_tanh_and_mul",
            3 * tokens * inter * es,
            lambda: ops.gelu_tanh_and_mul(act, gu),
            lambda: eager_gelu_tanh_and_mul(gu),
            lambda: compiled[eager_gelu_tanh_and_mul](gu),
        ),
    ]


def sort_top_k_top_p(logits: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The sampler's previous truncation: a full vocabulary sort, cumulative sums, a scatter."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(ranks >= k.unsqueeze(1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    drop = (probs.cumsum(dim=-1) - probs) > p.unsqueeze(1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def sampling_rows(rows: int, vocab: int) -> tuple[str, float, float]:
    """Top-k 50 + top-p 0.9 truncation of [rows, vocab] logits: the threshold op (+ softmax and
    the mask) against the sort-based version."""
    logits = torch.randn(rows, vocab, device="cuda") * 3
    k = torch.full((rows,), 50, dtype=torch.int32, device="cuda")
    p = torch.full((rows,), 0.9, device="cuda")
    min_p = torch.zeros(rows, device="cuda")
    thr = torch.empty(rows, device="cuda")

    def threshold() -> None:
        probs = logits.softmax(-1)
        ops.top_k_top_p_threshold(thr, probs, k, p, min_p)
        probs.masked_fill_(probs < thr[:, None], 0.0)

    return (
        f"top-k/top-p {rows}x{vocab}",
        time_graph(threshold, reps=10),
        time_graph(lambda: sort_top_k_top_p(logits, k.long(), p), reps=10),
    )


def sampling_draw(rows: int, vocab: int) -> tuple[str, float, float]:
    """The random draw from [rows, vocab] probabilities: the race op (noise hashed in registers)
    against torch's exponential noise array, division and argmax."""
    probs = torch.softmax(torch.randn(rows, vocab, device="cuda"), -1)
    thr = torch.zeros(rows, device="cuda")
    keys = torch.randint(0, 1 << 62, (rows,), device="cuda")
    tokens = torch.empty(rows, dtype=torch.int64, device="cuda")
    noise = torch.empty_like(probs)

    def torch_draw() -> None:
        (probs / noise.exponential_()).argmax(dim=-1)

    return (
        f"draw {rows}x{vocab}",
        time_graph(lambda: ops.sample_exponential_race(tokens, probs, thr, keys), reps=10),
        time_graph(torch_draw, reps=10),
    )


def try_time(fn: Callable[[], object]) -> Optional[float]:
    try:
        return time_graph(fn)
    except Exception as e:  # e.g. torch.compile without a working triton: reported as n/a
        print(f"    (n/a: {type(e).__name__}: {str(e).splitlines()[0][:100]})")
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the 1B model at 256 tokens only")
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args()
    bw = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(
        f"device: {props.name}; copy bandwidth (read + write) {bw / 1e12:.2f} TB/s; "
        f"{DTYPE}, torch {torch.__version__}\n"
    )
    rows: list[dict] = []
    # The sampling table first: it needs no compilation, so a slow torch.compile cannot lose it.
    print("| sampling step | pagedkv op us | torch us | speed-up |")
    print("|---|---|---|---|")
    for b, v in [(64, 128256)] if args.quick else [(64, 128256), (256, 128256), (256, 32000)]:
        for name, t_op, t_torch in (sampling_rows(b, v), sampling_draw(b, v)):
            print(
                f"| {name} | {t_op * 1e6:.1f} | {t_torch * 1e6:.1f} | {t_torch / t_op:.2f}x |",
                flush=True,
            )
            rows.append({"op": name, "pagedkv_s": t_op, "torch_s": t_torch})
    print(
        "\n| model | tokens | op | pagedkv us | eager us | compile us | vs eager | vs compile "
        "| bw |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    shapes = [("1B", 256)] if args.quick else [("1B", 256), ("8B", 256), ("8B", 4096)]
    for model, tokens in shapes:
        for name, nbytes, fused, eager, comp in cases(tokens, model):
            tf, te, tc = time_graph(fused), time_graph(eager), try_time(comp)

            def us(t: Optional[float]) -> str:
                return f"{t * 1e6:.1f}" if t else "n/a"

            ratio_c = f"{tc / tf:.2f}x" if tc else "n/a"
            print(
                f"| {model} | {tokens} | {name} | {us(tf)} | {us(te)} | {us(tc)} | "
                f"{te / tf:.2f}x | {ratio_c} | {nbytes / tf / bw:.0%} |",
                flush=True,
            )
            rows.append(
                {
                    "model": model,
                    "tokens": tokens,
                    "op": name,
                    "pagedkv_s": tf,
                    "eager_s": te,
                    "compile_s": tc,
                    "bytes": nbytes,
                    "copy_bw": bw,
                }
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": props.name, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
