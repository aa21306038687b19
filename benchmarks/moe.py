"""MoE throughput against the dense model of the same active parameters.

Layer: one FusedMoE layer (topk_softmax + two grouped GEMMs: "moe" is fused_experts' auto
kernel, torch._grouped_mm for bf16 on Hopper; "moe_pagedkv_kernel" the core's own grouped GEMM)
against a dense SwiGLU MLP of intermediate size top_k * I (the same FLOPs per token, through
torch / cuBLAS), and against the per-expert Python loop HF transformers runs, over batch sizes
from decode (1 token) to prefill (4096 tokens). Engine: LLM.generate tokens/s of a random
Mixtral-shaped model against a random Llama whose MLP has the same active size.

  python benchmarks/moe.py --device cuda --json moe.json     # H100 / H200, bf16
  python benchmarks/moe.py --device cpu --quick              # smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from pagedkv import ops
from pagedkv.models.moe import _grouped_mm_applies, auto_moe_kernel, fused_experts

# (name, hidden, expert intermediate, experts, top_k): Mixtral-8x7B's and Qwen3-30B-A3B's layer.
SHAPES = [("mixtral-8x7b", 4096, 14336, 8, 2), ("qwen3-30b-a3b", 2048, 768, 128, 8)]
QUICK_SHAPES = [("tiny", 256, 512, 8, 2)]


def timed(fn: Callable[[], Any], device: str, iters: int) -> float:
    """Median seconds per call after warm-up."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def hf_loop(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The per-expert loop of HF transformers' MixtralExperts (the baseline to beat)."""
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for e in ids.unique().tolist():
        tok, slot = torch.where(ids == e)
        h = F.linear(x[tok], w13[e])
        h = F.silu(h[:, :inter]) * h[:, inter:]
        out.index_add_(0, tok, (F.linear(h, w2[e]) * weights[tok, slot, None]).to(x.dtype))
    return out


def bench_layer(
    name: str,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    tokens: list[int],
    device: str,
    dtype: torch.dtype,
    iters: int,
    hf: bool = True,
) -> list[dict]:
    g = torch.Generator(device=device).manual_seed(0)
    w13 = torch.randn(experts, 2 * inter, hidden, device=device, dtype=dtype, generator=g) * 0.02
    w2 = torch.randn(experts, hidden, inter, device=device, dtype=dtype, generator=g) * 0.02
    gate = torch.randn(experts, hidden, device=device, dtype=dtype, generator=g) * 0.02
    dense_gu = torch.randn(2 * top_k * inter, hidden, device=device, dtype=dtype, generator=g)
    dense_d = torch.randn(hidden, top_k * inter, device=device, dtype=dtype, generator=g)
    rows = []
    for t in tokens:
        x = torch.randn(t, hidden, device=device, dtype=dtype, generator=g)

        def moe(x: torch.Tensor = x, kernel: str = "auto") -> torch.Tensor:
            w, ids = ops.topk_softmax(F.linear(x, gate), top_k, True)
            return fused_experts(x, w13, w2, w, ids, kernel=kernel)

        def moe_pagedkv(x: torch.Tensor = x) -> torch.Tensor:
            return moe(x, "pagedkv")

        def moe_grouped_mm(x: torch.Tensor = x) -> torch.Tensor:
            return moe(x, "grouped_mm")

        def dense(x: torch.Tensor = x) -> torch.Tensor:
            h = F.linear(x, dense_gu)
            return F.linear(F.silu(h[:, : top_k * inter]) * h[:, top_k * inter :], dense_d)

        def loop(x: torch.Tensor = x) -> torch.Tensor:
            w, ids = ops.topk_softmax(F.linear(x, gate), top_k, True)
            return hf_loop(x, w13, w2, w.to(device), ids.long())

        flops = 2 * t * 3 * hidden * inter * top_k
        row: dict[str, Any] = {"shape": name, "tokens": t}
        fns = [("moe", moe), ("moe_pagedkv_kernel", moe_pagedkv)]
        if _grouped_mm_applies(x, w13, w2):  # the two kernels "auto" chooses between, named
            fns.append(("moe_grouped_mm", moe_grouped_mm))
            row["auto_kernel"] = auto_moe_kernel(t, top_k, experts)
        fns.append(("dense", dense))
        if hf:
            fns.append(("hf_loop", loop))
        for key, fn in fns:
            s = timed(fn, device, iters)
            row[f"{key}_us"] = round(s * 1e6, 1)
            row[f"{key}_tflops"] = round(flops / s / 1e12, 2)
        row["moe_vs_dense"] = round(row["dense_us"] / row["moe_us"], 3)
        if hf:
            row["moe_vs_hf_loop"] = round(row["hf_loop_us"] / row["moe_us"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def bench_engine(device: str, quick: bool) -> list[dict]:
    """tokens/s of LLM.generate: a random Mixtral-shaped model vs the dense Llama of the same
    active MLP size (top_k * I)."""
    from pagedkv import LLM, SamplingParams
    from pagedkv.testing import save_random_model

    h, layers, inter, e, k = (128, 2, 256, 8, 2) if quick else (1024, 8, 2048, 8, 2)
    common = dict(
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=h // 64,
        num_key_value_heads=max(1, h // 256),
        head_dim=64,
        max_position_embeddings=4096,
        vocab_size=32000,
    )
    prompts, in_len, out_len = (8, 32, 16) if quick else (128, 128, 128)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "mixtral": save_random_model(
                f"{tmp}/moe",
                "tiny-mixtral",
                tokenizer=False,
                dtype=torch.bfloat16,
                intermediate_size=inter,
                num_local_experts=e,
                num_experts_per_tok=k,
                **common,
            ),
            "dense": save_random_model(
                f"{tmp}/dense",
                "tiny-llama",
                tokenizer=False,
                dtype=torch.bfloat16,
                intermediate_size=k * inter,
                **common,
            ),
        }
        g = torch.Generator().manual_seed(0)
        ids = [torch.randint(10, 32000, (in_len,), generator=g).tolist() for _ in range(prompts)]
        params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
        for name, path in models.items():
            llm = LLM(
                path,
                skip_tokenizer_init=True,
                device=device,
                seed=0,
                **({"kv_cache_space": 1.0} if device == "cpu" else {"gpu_memory_utilization": 0.4}),
            )
            llm.generate([{"prompt_token_ids": p} for p in ids[:4]], params)  # warm-up
            t0 = time.perf_counter()
            llm.generate([{"prompt_token_ids": p} for p in ids], params)
            s = time.perf_counter() - t0
            row = {
                "engine": name,
                "prompts": prompts,
                "input_len": in_len,
                "output_len": out_len,
                "seconds": round(s, 3),
                "output_tok_s": round(prompts * out_len / s, 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
            del llm
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CPU smoke run)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-hf-loop", action="store_true", help="no HF per-expert loop column")
    ap.add_argument("--shape", default=None, help="only this layer shape (e.g. qwen3-30b-a3b)")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts")
    ap.add_argument("--json", default=None, help="write every row to this file")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    tokens = [1, 16, 64] if args.quick else [1, 16, 64, 256, 1024, 4096]
    if args.tokens:
        tokens = [int(t) for t in args.tokens.split(",")]
    rows: dict[str, list] = {"layer": [], "engine": []}
    for shape in QUICK_SHAPES if args.quick else SHAPES:
        if args.shape and shape[0] != args.shape:
            continue
        rows["layer"] += bench_layer(
            *shape, tokens, args.device, dtype, args.iters, not args.skip_hf_loop
        )
    if not args.skip_engine:
        rows["engine"] = bench_engine(args.device, args.quick)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
