"""Offline throughput: pagedkv LLM.generate vs HF transformers, same prompts, same lengths.

Peers, measured side by side in one run on the same weights:
  * HF ``generate`` (static batches of --hf-batch-size prompts; equal lengths, so no padding),
  * HF continuous batching (``model.generate_batch``) where the installed transformers has it.
All runs are greedy with EOS ignored, so every system produces exactly num_prompts x output_len
tokens. ``--check`` also compares greedy tokens and first-token logprobs with HF.

  python benchmarks/throughput.py                                # CPU, SmolLM2 (default model)
  python benchmarks/throughput.py --random-llama-1b /tmp/llama1b --device cuda  # H100
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np
import torch


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="model for all systems (default: SmolLM2)")
    ap.add_argument(
        "--random-llama-1b",
        metavar="DIR",
        default=None,
        help="build (if missing) and use a random-weight ~1B Llama HF dir here",
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="auto", help="auto (fp32 CPU / bf16 GPU), float16, ...")
    ap.add_argument("--num-prompts", type=int, default=32, help="requests")
    ap.add_argument("--input-len", type=int, default=64, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    ap.add_argument(
        "--hf-batch-sizes",
        default="all",
        help="comma-separated HF generate batch sizes, one table row each "
        "('all' = every prompt in one batch)",
    )
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.5,
        help="pagedkv's share of GPU memory (HF runs in the same process)",
    )
    ap.add_argument("--max-num-seqs", type=int, default=256, help="pagedkv max_num_seqs")
    ap.add_argument(
        "--kv-cache-space",
        type=float,
        default=1.0,
        help="pagedkv KV cache GiB on the CPU (not passed on a GPU, where "
        "--gpu-memory-utilization sizes it)",
    )
    ap.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
        help="pagedkv KV-cache element type (HF keeps its own dense cache)",
    )
    ap.add_argument("--enforce-eager", action="store_true", help="pagedkv without CUDA graphs")
    ap.add_argument(
        "--async-scheduling",
        choices=["off", "on", "both"],
        default="on",
        help="pagedkv schedules step N+1 while the GPU runs step N (the engine's default; off: "
        "the serial loop; both: time the serial and the overlapped loop on the same engine, one "
        "row each)",
    )
    ap.add_argument("--skip-hf", action="store_true", help="skip HF generate")
    ap.add_argument("--skip-hf-cb", action="store_true", help="skip HF continuous batching")
    ap.add_argument(
        "--check",
        type=int,
        default=0,
        metavar="K",
        help="compare greedy tokens / logprobs with HF on the first K prompts",
    )
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    return ap.parse_args()


def random_llama_1b(out_dir: str) -> str:
    """The models' seeded random ~1B Llama checkpoint (built once; no tokenizer needed: the
    benchmark feeds token ids and the engine runs with skip_tokenizer_init)."""
    from pagedkv.testing import save_random_model

    if not os.path.isfile(os.path.join(out_dir, "model.safetensors")):
        t0 = time.perf_counter()
        save_random_model(out_dir, "llama-1b", dtype=torch.bfloat16, tokenizer=False)
        print(
            f"built random llama-1b in {out_dir} ({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
        )
    return out_dir


def make_prompts(n: int, length: int, vocab: int, seed: int = 0) -> List[List[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, min(vocab, 30000), length).tolist() for _ in range(n)]


def torch_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        return torch.float32 if device == "cpu" else torch.bfloat16
    return getattr(torch, name)


def load_hf(model: Optional[str], dtype: torch.dtype, device: str) -> Any:
    import transformers
    from pagedkv.models.registry import resolve_model

    src = resolve_model(model)
    kw: Dict[str, Any] = {"dtype": dtype}
    if src.kind == "gguf":
        kw["gguf_file"] = os.path.basename(src.path)
    return transformers.AutoModelForCausalLM.from_pretrained(src.directory, **kw).to(device).eval()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_llm(args: argparse.Namespace) -> Any:
    from pagedkv import LLM

    return LLM(
        args.model,
        device=args.device,
        dtype=args.dtype,
        kv_cache_space=args.kv_cache_space if args.device == "cpu" else None,
        kv_cache_dtype=args.kv_cache_dtype,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
        max_model_len=args.input_len + args.output_len + 16,
        skip_tokenizer_init=args.random_llama_1b is not None,
    )


def bench_pagedkv(
    args: argparse.Namespace,
    llm: Any,
    prompts: List[List[int]],
    warmup: List[List[int]],
    overlap: Optional[bool] = None,
) -> Dict[str, Any]:
    """`warmup`: prompts of the same length but other tokens, so that the timed run finds none of
    its prompts in the prefix cache (HF has no prefix cache to warm)."""
    from pagedkv import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(warmup, params, use_tqdm=False)
    sync(args.device)
    if overlap is not None:
        llm.llm_engine.core.set_async_scheduling(overlap)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync(args.device)
    elapsed = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    mode = "eager" if args.enforce_eager or args.device == "cpu" else "CUDA graphs"
    overlap = llm.llm_engine.core.async_scheduling
    if args.kv_cache_dtype != "auto":
        mode += f", {args.kv_cache_dtype} KV"
    if overlap:
        mode += ", async scheduling"
    return {
        "system": f"pagedkv LLM.generate ({mode})",
        "elapsed_s": elapsed,
        "tokens": tokens,
        "token_ids": [o.outputs[0].token_ids for o in outs],
    }


def bench_hf_generate(
    args: argparse.Namespace, hf: Any, prompts: List[List[int]], bs: int
) -> Dict[str, Any]:
    dev = args.device

    def run(batch: List[List[int]]) -> torch.Tensor:
        ids = torch.tensor(batch, device=dev)
        with torch.no_grad():
            return hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=args.output_len,
                min_new_tokens=args.output_len,
                pad_token_id=0,
            )

    run(prompts[:2])  # warm-up
    sync(dev)
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(prompts), bs):
        out = run(prompts[i : i + bs])
        tokens += (out.shape[1] - args.input_len) * out.shape[0]
    sync(dev)
    return {
        "system": f"HF generate (batch {bs})",
        "elapsed_s": time.perf_counter() - t0,
        "tokens": tokens,
    }


def bench_hf_cb(
    args: argparse.Namespace, hf: Any, prompts: List[List[int]]
) -> Optional[Dict[str, Any]]:
    if not hasattr(hf, "generate_batch"):
        return None
    from transformers import GenerationConfig

    cfg = GenerationConfig(
        max_new_tokens=args.output_len,
        min_new_tokens=args.output_len,
        do_sample=False,
        eos_token_id=-1,
        pad_token_id=0,
    )
    try:
        hf.generate_batch(inputs=prompts[:2], generation_config=cfg)  # warm-up
        sync(args.device)
        t0 = time.perf_counter()
        res = hf.generate_batch(inputs=prompts, generation_config=cfg)
        sync(args.device)
        elapsed = time.perf_counter() - t0
    except Exception as e:  # report, do not hide: the table says why the row is missing
        print(f"HF continuous batching failed: {type(e).__name__}: {e}", file=sys.stderr)
        return {"system": "HF generate_batch (continuous batching)", "error": str(e)[:200]}
    tokens = sum(len(r.generated_tokens) for r in res.values())
    return {
        "system": "HF generate_batch (continuous batching)",
        "elapsed_s": elapsed,
        "tokens": tokens,
    }


def check_agreement(
    args: argparse.Namespace, hf: Any, llm: Any, prompts: List[List[int]]
) -> Dict[str, Any]:
    """Greedy tokens (prefix agreement) and first-token logprobs of pagedkv vs HF.

    Logprobs are compared on the same token ids: HF's top-5 ids looked up in pagedkv's top-20
    (a missing id counts as a disagreement). In bf16 the logits themselves are rounded to 8
    significant bits, so two correct implementations differ by up to about one bf16 step of the
    largest logit ("logit_bf16_step"); with a half-precision dtype HF is also re-run in float32,
    and both are measured against that reference: pagedkv's error should match HF's own."""
    from pagedkv import SamplingParams

    k = min(args.check, len(prompts))
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True, logprobs=20)
    outs = llm.generate(prompts[:k], params, use_tqdm=False)
    ours = [o.outputs[0] for o in outs]
    matched = total = top1_same = top5_same = missing = 0
    worst, step = 0.0, 0.0
    hf_lps = []
    for p, o in zip(prompts[:k], ours):
        ref = hf_greedy(args, hf, p)
        logits = hf_first_logits(args, hf, p)
        lp = torch.log_softmax(logits, -1)
        hf_lps.append(lp)
        n = next((i for i, (a, b) in enumerate(zip(o.token_ids, ref)) if a != b), len(ref))
        matched, total = matched + n, total + len(ref)
        first = o.logprobs[0]
        top1_same += int(o.token_ids[0] == int(lp.argmax()))
        hf_top5 = lp.topk(5).indices.tolist()
        top5_same += len(set(hf_top5) & {t for t, e in first.items() if e.rank <= 5})
        for tid in hf_top5:
            if tid not in first:
                missing += 1
                continue
            worst = max(worst, abs(first[tid].logprob - float(lp[tid])))
        step = max(step, bf16_step(logits))
    result: Dict[str, Any] = {
        "prompts": k,
        "greedy_prefix_agreement": matched / max(total, 1),
        "first_token_top1_agreement": top1_same / k,
        "top5_ids_agreement": top5_same / (5 * k),
        "hf_top5_missing_from_ours_top20": missing,
        "max_abs_logprob_diff_same_ids": worst,
        "logit_bf16_step": step,
    }
    if torch_dtype(args.dtype, args.device).itemsize < 4:
        result.update(fp32_reference(args, hf, prompts[:k], ours, hf_lps))
    return result


def hf_greedy(args: argparse.Namespace, hf: Any, prompt: List[int]) -> List[int]:
    ids = torch.tensor([prompt], device=args.device)
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=args.output_len,
            min_new_tokens=args.output_len,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def hf_first_logits(args: argparse.Namespace, hf: Any, prompt: List[int]) -> torch.Tensor:
    ids = torch.tensor([prompt], device=args.device)
    with torch.no_grad():
        return hf(ids).logits[0, -1].float()


def bf16_step(logits: torch.Tensor) -> float:
    """Spacing of bfloat16 numbers at the largest |logit| (8 significant bits)."""
    top = float(logits.abs().max())
    return 2.0 ** (math.floor(math.log2(top)) - 7) if top > 0 else 0.0


def fp32_reference(
    args: argparse.Namespace,
    hf: Any,
    prompts: List[List[int]],
    ours: List[Any],
    hf_lps: List[torch.Tensor],
) -> Dict[str, Any]:
    """HF in float32 (the same weights, upcast) as the reference for both bf16 results, on the
    reference's top-5 ids of the first token."""
    hf.float()
    err_ours = err_hf = 0.0
    missing = 0
    for p, o, lp_hf in zip(prompts, ours, hf_lps):
        ref = torch.log_softmax(hf_first_logits(args, hf, p), -1)
        first = o.logprobs[0]
        for tid in ref.topk(5).indices.tolist():
            err_hf = max(err_hf, abs(float(lp_hf[tid]) - float(ref[tid])))
            if tid in first:
                err_ours = max(err_ours, abs(first[tid].logprob - float(ref[tid])))
            else:
                missing += 1
    return {
        "fp32_ref_max_abs_logprob_err_pagedkv": err_ours,
        "fp32_ref_max_abs_logprob_err_hf": err_hf,
        "fp32_ref_top5_missing_from_ours_top20": missing,
    }


def main() -> None:
    args = parse_args()
    if args.random_llama_1b:
        args.model = random_llama_1b(args.random_llama_1b)
    dtype = torch_dtype(args.dtype, args.device)
    llm = make_llm(args)
    vocab = llm.llm_engine.model_config.vocab_size
    prompts = make_prompts(args.num_prompts, args.input_len, vocab)
    warmup = make_prompts(2, args.input_len, vocab, seed=1)
    if args.async_scheduling == "both":
        # Serial first, then overlapped on other prompts of the same shape (no prefix-cache
        # hits from the first run); the greedy tokens of both loops must agree.
        serial = bench_pagedkv(args, llm, prompts, warmup, overlap=False)
        other = make_prompts(args.num_prompts, args.input_len, vocab, seed=2)
        results = [serial, bench_pagedkv(args, llm, other, warmup, overlap=True)]
        check = bench_pagedkv(args, llm, prompts[:8], warmup, overlap=False)
        again = bench_pagedkv(args, llm, prompts[:8], warmup, overlap=True)
        same = check["token_ids"] == again["token_ids"]
        print(f"serial and overlapped greedy tokens identical (8 prompts): {same}")
    else:
        results = [bench_pagedkv(args, llm, prompts, warmup, overlap=args.async_scheduling == "on")]
    for r in results:
        r.pop("token_ids", None)
    hf = None
    if not (args.skip_hf and args.skip_hf_cb and not args.check):
        hf = load_hf(args.model, dtype, args.device)
    if not args.skip_hf:
        for b in args.hf_batch_sizes.split(","):
            bs = len(prompts) if b.strip() == "all" else int(b)
            results.append(bench_hf_generate(args, hf, prompts, bs))
    if not args.skip_hf_cb:
        cb = bench_hf_cb(args, hf, prompts)
        if cb is not None:
            results.append(cb)
    report(args, results)
    if args.check:
        agreement = check_agreement(args, hf, llm, prompts)
        print("agreement with HF:", json.dumps(agreement))
        results.append({"system": "agreement", **agreement})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def report(args: argparse.Namespace, results: List[Dict[str, Any]]) -> None:
    dev = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"\nmodel {args.model or 'smollm2'} on {dev}: {args.num_prompts} prompts, "
        f"{args.input_len} in / {args.output_len} out, greedy, EOS ignored"
    )
    base = results[0]["tokens"] / results[0]["elapsed_s"]
    print(f"{'system':<44} {'time s':>8} {'out tok/s':>10} {'pagedkv x':>10}")
    for r in results:
        if "error" in r:
            print(f"{r['system']:<44} {'failed':>8}  {r['error'][:60]}")
            continue
        tps = r["tokens"] / r["elapsed_s"]
        r["output_tokens_per_s"] = tps
        print(f"{r['system']:<44} {r['elapsed_s']:>8.2f} {tps:>10.1f} {base / tps:>10.2f}")


if __name__ == "__main__":
    main()
