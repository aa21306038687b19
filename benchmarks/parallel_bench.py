"""Tensor parallelism measured: TP=2 against TP=1 on a random-weight Llama-3-8B-shaped model.

Steps (each its own process, run by benchmarks/gpu_parallel_run.sh):
  write      the checkpoint (bf16, one safetensors file per layer, drawn on the GPU: seconds,
             where pagedkv.testing's CPU float32 generator takes minutes at this size)
  engine     one engine (--tp N): decode throughput at batch 1/32/256, prefill TFLOP/s, and
             greedy tokens of a fixed prompt set; JSON to --out
  allreduce  all-reduce latency over 2 GPUs at decode sizes ([batch, hidden] bf16), eager
             and inside a CUDA graph (how the decode runs it): NCCL, and torch's
             symmetric-memory one-shot all-reduce (checked against NCCL's sum)
  report     the side-by-side table (speedups, greedy agreement, all-reduce share of a step)

  python benchmarks/parallel_bench.py write --dir /tmp/llama8b
  python benchmarks/parallel_bench.py engine --dir /tmp/llama8b --tp 2 --out tp2.json
  python benchmarks/parallel_bench.py allreduce --out allreduce.json
  python benchmarks/parallel_bench.py report --out-dir $OUT

``--shape tiny --device cpu`` runs every step on a small model on the CPU (a dry run of the
script itself; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from typing import Any, Dict, List, Tuple

import torch

SHAPES: Dict[str, Dict[str, Any]] = {
    # Meta-Llama-3-8B's config.json shape.
    "llama3-8b": dict(
        hidden_size=4096,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
    ),
    "tiny": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        vocab_size=1000,
        max_position_embeddings=4096,
        rope_theta=10000.0,
    ),
}
BATCHES = (1, 32, 256)
INPUT_LEN, OUTPUT_LEN = 128, 128
PREFILL_SEQS, PREFILL_LEN = 16, 1024


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------- write
def write_checkpoint(path: str, shape: str, device: str, layers: int) -> None:
    from safetensors.torch import save_file

    cfg = dict(
        SHAPES[shape],
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        hidden_act="silu",
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="bfloat16",
    )
    if layers:
        cfg["num_hidden_layers"] = layers
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    h, d = cfg["hidden_size"], cfg["head_dim"]
    q, kv, ff, vocab = (
        cfg["num_attention_heads"] * d,
        cfg["num_key_value_heads"] * d,
        cfg["intermediate_size"],
        cfg["vocab_size"],
    )
    g = torch.Generator(device=device).manual_seed(0)

    def lin(out_f: int, in_f: int) -> torch.Tensor:  # std 1/sqrt(fan_in): activations O(1)
        w = torch.randn(out_f, in_f, generator=g, device=device) / in_f**0.5
        return w.to(torch.bfloat16).cpu()

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=g, device=device)).to(torch.bfloat16).cpu()

    weight_map: Dict[str, str] = {}

    def save(tensors: Dict[str, torch.Tensor], name: str) -> None:
        save_file(tensors, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in tensors})

    save(
        {
            "model.embed_tokens.weight": lin(vocab, h) * (h**0.5),
            "model.norm.weight": norm(h),
            "lm_head.weight": lin(vocab, h),
        },
        "outer.safetensors",
    )
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        save(
            {
                p + "self_attn.q_proj.weight": lin(q, h),
                p + "self_attn.k_proj.weight": lin(kv, h),
                p + "self_attn.v_proj.weight": lin(kv, h),
                p + "self_attn.o_proj.weight": lin(h, q),
                p + "mlp.gate_proj.weight": lin(ff, h),
                p + "mlp.up_proj.weight": lin(ff, h),
                p + "mlp.down_proj.weight": lin(h, ff),
                p + "input_layernorm.weight": norm(h),
                p + "post_attention_layernorm.weight": norm(h),
            },
            f"layer{i:03d}.safetensors",
        )
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


# ---------------------------------------------------------------------------------- engine
def _prompts(n: int, length: int, vocab: int, seed: int) -> List[Dict[str, List[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {"prompt_token_ids": torch.randint(3, vocab, (length,), generator=g).tolist()}
        for _ in range(n)
    ]


def _timed(llm: Any, prompts: list, max_tokens: int) -> float:
    from pagedkv import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - t0


def run_engine(
    path: str, tp: int, device: str, out: str, batches: List[int], all_reduce: str
) -> None:
    from pagedkv import LLM, SamplingParams

    if device == "cpu":
        torch.set_num_threads(1)

    cfg = _read_json(os.path.join(path, "config.json"))
    dtype = "bfloat16" if device == "cuda" else "float32"
    t0 = time.perf_counter()
    llm = LLM(
        path,
        device=device,
        dtype=dtype,
        tensor_parallel_size=tp,
        tp_all_reduce=all_reduce,
        max_model_len=2048,
        max_num_seqs=max(batches),
        skip_tokenizer_init=True,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.85,
        kv_cache_space=1.0,
    )
    result: Dict[str, Any] = {
        "tp": tp,
        "tp_all_reduce": all_reduce,
        "device": device,
        "load_s": time.perf_counter() - t0,
        "num_gpu_blocks": llm.llm_engine.num_gpu_blocks,
    }
    vocab = cfg["vocab_size"]
    _timed(llm, _prompts(2, 16, vocab, 0), 4)  # warm-up
    # The serial loop, then the overlapped one (async_scheduling) on the same engine.
    for key, overlap in (("decode", False), ("decode_async", True)):
        llm.llm_engine.core.set_async_scheduling(overlap)
        result[key] = _decode_runs(llm, tp, vocab, batches, key)
    llm.llm_engine.core.set_async_scheduling(False)
    runner = llm.llm_engine.runner
    if hasattr(runner, "min_graph_replays"):  # every rank's decode steps ran as graphs
        result["min_graph_replays"] = runner.min_graph_replays()
    t = _timed(llm, _prompts(PREFILL_SEQS, PREFILL_LEN, vocab, 99), 1)
    result["prefill"] = {"seconds": t, "tflops": _prefill_flops(cfg) / t / 1e12}
    print(
        f"tp={tp} prefill {PREFILL_SEQS}x{PREFILL_LEN}: {result['prefill']['tflops']:.1f} TFLOP/s",
        flush=True,
    )
    greedy = llm.generate(
        _prompts(8, 64, vocab, 7),
        SamplingParams(temperature=0, max_tokens=64, ignore_eos=True),
        use_tqdm=False,
    )
    result["greedy"] = [o.outputs[0].token_ids for o in greedy]
    with open(out, "w") as f:
        json.dump(result, f)


def _decode_runs(
    llm: Any, tp: int, vocab: int, batches: List[int], label: str
) -> Dict[int, Dict[str, float]]:
    decode = {}
    for bs in batches:
        prompts = _prompts(bs, INPUT_LEN, vocab, bs)
        prefill = _timed(llm, prompts, 1)
        total = _timed(llm, prompts, OUTPUT_LEN)
        steps = OUTPUT_LEN - 1
        decode[bs] = {
            "total_s": total,
            "prefill_s": prefill,
            "output_tok_s": bs * OUTPUT_LEN / total,
            "decode_tok_s": bs * steps / max(total - prefill, 1e-9),
            "step_ms": 1e3 * max(total - prefill, 0.0) / steps,
        }
        print(
            f"tp={tp} {label} batch {bs}: {decode[bs]['output_tok_s']:.0f} output tok/s, "
            f"decode step {decode[bs]['step_ms']:.2f} ms",
            flush=True,
        )
    return decode


def _prefill_flops(cfg: Dict[str, Any]) -> float:
    """Matmul FLOPs of the prefill run: 2 x weights x tokens for the layers (the LM head runs on
    one row per sequence), plus causal attention's QK^T and PV (seq^2 / 2 each, per head dim)."""
    h, d, layers = cfg["hidden_size"], cfg["head_dim"], cfg["num_hidden_layers"]
    q, kv, ff = (
        cfg["num_attention_heads"] * d,
        cfg["num_key_value_heads"] * d,
        cfg["intermediate_size"],
    )
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * ff
    tokens = PREFILL_SEQS * PREFILL_LEN
    attn = 2 * 2 * (PREFILL_LEN**2 / 2) * q * layers * PREFILL_SEQS
    return 2 * per_layer * layers * tokens + attn + 2 * h * cfg["vocab_size"] * PREFILL_SEQS


# ---------------------------------------------------------------------------------- allreduce
def _time_collective(fn: Any) -> Tuple[float, float]:
    """us per call of ``fn`` eagerly and inside a CUDA graph (as a captured decode step runs
    its all-reduces: no launch overhead)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    n = 200
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        fn()
    b.record()
    torch.cuda.synchronize()
    eager = a.elapsed_time(b) * 1e3 / n
    graph, k = torch.cuda.CUDAGraph(), 64
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        for _ in range(k):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    a.record()
    for _ in range(10):
        graph.replay()
    b.record()
    torch.cuda.synchronize()
    return eager, a.elapsed_time(b) * 1e3 / (10 * k)


def _one_shot(x: torch.Tensor, dist: Any) -> Dict[str, Any]:
    """torch's symmetric-memory one-shot all-reduce (each GPU reads the peers' buffers over
    NVLink, no NCCL; no multicast needed): its time and its largest difference from NCCL's
    sum of the same inputs."""
    import torch.distributed._symmetric_memory as symm_mem

    group = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group)
    buf = symm_mem.empty(x.shape, dtype=x.dtype, device=x.device)
    symm_mem.rendezvous(buf, group)
    buf.copy_(x)
    want = x.clone()
    dist.all_reduce(want)
    got = torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", group)
    diff = (got.float() - want.float()).abs().max().item()
    one_shot = torch.ops.symm_mem.one_shot_all_reduce
    eager, graph = _time_collective(functools.partial(one_shot, buf, "sum", group))
    return {"one_shot_eager_us": eager, "one_shot_graph_us": graph, "one_shot_max_diff": diff}


def _allreduce_rank(rank: int, port: int, hidden: int, out: str, batches: List[int]) -> None:
    import datetime

    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=2,
        rank=rank,
        timeout=datetime.timedelta(seconds=60),
    )
    res: Dict[str, Any] = {}
    for bs in batches:
        x = torch.randn(bs, hidden, dtype=torch.bfloat16, device="cuda")
        eager, graph = _time_collective(functools.partial(dist.all_reduce, x))
        res[str(bs)] = {"eager_us": eager, "graph_us": graph, "bytes": x.numel() * 2}
    # NCCL's figures are written first: a one-shot attempt that hangs (one rank failing its
    # rendezvous) then loses nothing when the step's timeout ends it.
    _write_rank0(rank, out, res)
    for bs in batches:
        x = torch.randn(bs, hidden, dtype=torch.bfloat16, device="cuda")
        try:
            res[str(bs)].update(_one_shot(x, dist))
        except Exception as exc:  # noqa: BLE001 (an older torch, no P2P: say so, go on)
            res[str(bs)]["one_shot_error"] = repr(exc)[:300]
    _write_rank0(rank, out, res)
    dist.destroy_process_group()


def _write_rank0(rank: int, out: str, res: Dict[str, Any]) -> None:
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)


def run_allreduce(out: str, hidden: int, batches: List[int]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(
        _allreduce_rank, args=(port, hidden, out, batches), nprocs=2, join=True
    )


# ---------------------------------------------------------------------------------- report
def _decode_rows(loop: str, one: Any, two: Any, ar: Any, layers: int) -> List[str]:
    """Table rows of one decode loop: TP=1 vs TP=2 per batch, and the all-reduces' share."""
    lines = []
    for bs in sorted(set(one) & set(two), key=int):
        a, b = one[bs], two[bs]
        share = ""
        if ar and bs in ar:
            # 2 per layer (attention, MLP) + the embedding's.
            n_ar = 2 * layers + 1
            ar_ms = n_ar * ar[bs]["graph_us"] / 1e3
            share = (
                f"{n_ar} x {ar[bs]['graph_us']:.1f} = {ar_ms:.2f} ms | "
                f"{100 * ar_ms / max(b['step_ms'], 1e-9):.0f}%"
            )
        lines.append(
            f"| {loop} | {bs} | {a['output_tok_s']:.0f} | {b['output_tok_s']:.0f} | "
            f"{b['output_tok_s'] / a['output_tok_s']:.2f}x | {a['step_ms']:.2f} | "
            f"{b['step_ms']:.2f} | {b['step_ms'] / a['step_ms']:.2f} | {share} |"
        )
    return lines


def _targets(one: Any, two: Any) -> List[str]:
    """Issue #29's targets, from the better of the two loops of each engine."""

    def best(res: Any, bs: str, key: str) -> float:
        runs = [res[k][bs][key] for k in ("decode", "decode_async") if bs in res.get(k, {})]
        return (min if key == "step_ms" else max)(runs) if runs else float("nan")

    tput = best(two, "256", "output_tok_s") / best(one, "256", "output_tok_s")
    lat = best(two, "1", "step_ms") / best(one, "1", "step_ms")
    return [
        f"targets (best loop each): TP=2 / TP=1 output tok/s at batch 256 = {tput:.2f}x "
        f"(target >= 1.8x: {'met' if tput >= 1.8 else 'MISSED'}); batch-1 decode step "
        f"TP=2 / TP=1 = {lat:.2f} (target <= 0.6: {'met' if lat <= 0.6 else 'MISSED'})"
    ]


def report(out_dir: str) -> str:
    def load(name: str) -> Any:
        p = os.path.join(out_dir, name)
        return _read_json(p) if os.path.exists(p) else None

    one, two, ar = load("tp1.json"), load("tp2.json"), load("allreduce.json")
    lines = [
        "| batch | TP=1 output tok/s | TP=2 output tok/s | speed-up | TP=1 step ms | "
        "TP=2 step ms | ratio | all-reduces/step x graph us | share of TP=2 step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    if one and two:
        layers = (load("config.json") or {"num_hidden_layers": 32})["num_hidden_layers"]
        lines[0] = "| loop " + lines[0]
        lines[1] = "|---" + lines[1]
        one_shot = load("tp2_one_shot.json") or {}
        for loop, key in (("serial", "decode"), ("async", "decode_async")):
            if key in one and key in two:
                lines += _decode_rows(loop, one[key], two[key], ar, layers)
            if key in one and key in one_shot:  # TP=2 with tp_all_reduce="one_shot"
                lines += _decode_rows(f"{loop} one_shot", one[key], one_shot[key], None, layers)
        same = sum(x == y for x, y in zip(one["greedy"], two["greedy"]))
        toks = [sum(u == v for u, v in zip(x, y)) for x, y in zip(one["greedy"], two["greedy"])]
        first = [
            next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), len(x))
            for x, y in zip(one["greedy"], two["greedy"])
        ]
        lines += [
            "",
            f"prefill {PREFILL_SEQS}x{PREFILL_LEN}: TP=1 "
            f"{one['prefill']['tflops']:.1f} TFLOP/s, TP=2 "
            f"{two['prefill']['tflops']:.1f} TFLOP/s (both GPUs together)",
            f"greedy agreement (bf16, 8 prompts x 64 tokens): {same}/8 sequences "
            f"identical, {sum(toks)}/{8 * 64} tokens equal position by position, first "
            f"divergence at {first}",
            f"load: TP=1 {one['load_s']:.1f} s, TP=2 {two['load_s']:.1f} s; KV blocks: "
            f"TP=1 {one['num_gpu_blocks']}, TP=2 {two['num_gpu_blocks']}",
            f"decode steps replayed as CUDA graphs on every TP=2 rank (the fewest over ranks): "
            f"{two.get('min_graph_replays', 'n/a')}",
        ]
        lines += _targets(one, two)
    if ar:
        lines += [
            "",
            "NCCL all-reduce, 2 GPUs, bf16 [batch, hidden]: "
            + ", ".join(
                f"batch {bs}: {v['eager_us']:.1f} us eager / {v['graph_us']:.1f} us in a graph"
                for bs, v in ar.items()
            ),
            "symmetric-memory one-shot all-reduce, same sizes: "
            + ", ".join(
                f"batch {bs}: {v['one_shot_eager_us']:.1f} us eager / "
                f"{v['one_shot_graph_us']:.1f} us in a graph (max diff vs NCCL "
                f"{v['one_shot_max_diff']:.3g})"
                if "one_shot_graph_us" in v
                else f"batch {bs}: unavailable ({v.get('one_shot_error', '?')})"
                for bs, v in ar.items()
            ),
        ]
    text = "\n".join(lines)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(text + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["write", "engine", "allreduce", "report"])
    ap.add_argument("--dir", default="/tmp/llama8b", help="checkpoint folder")
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="fewer layers than the shape's")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tp-all-reduce", default="nccl", choices=["nccl", "one_shot"])
    ap.add_argument("--out", default="result.json")
    ap.add_argument("--out-dir", default=".")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    args = ap.parse_args()
    if args.step == "write":
        if os.path.exists(os.path.join(args.dir, "model.safetensors.index.json")):
            print(f"{args.dir}: already written")
            return
        t0 = time.perf_counter()
        write_checkpoint(args.dir, args.shape, args.device, args.layers)
        print(f"wrote {args.dir} in {time.perf_counter() - t0:.1f} s")
    elif args.step == "engine":
        run_engine(args.dir, args.tp, args.device, args.out, args.batches, args.tp_all_reduce)
    elif args.step == "allreduce":
        run_allreduce(args.out, SHAPES[args.shape]["hidden_size"], args.batches)
    else:
        print(report(args.out_dir))


if __name__ == "__main__":
    main()
