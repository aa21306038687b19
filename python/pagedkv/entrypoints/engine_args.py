"""Engine flags shared by the CLI commands (generate, chat, bench, serve), with vLLM's names."""

from __future__ import annotations

import argparse
from typing import Any, Dict

# vLLM's --kv-cache-dtype choices (pagedkv.engine.config.KV_CACHE_DTYPES; spelled out here so
# building the parser does not import torch).
KV_CACHE_DTYPE_CHOICES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
KV_CACHE_DTYPE_HELP = ("KV-cache element type: 'auto' (the model dtype), or fp8 at 1 byte per "
                       "element, which doubles the cached tokens of a 16-bit model: 'fp8' = "
                       "'fp8_e4m3' (3-bit mantissa) or 'fp8_e5m2' (wider range, 2-bit mantissa); "
                       "scales 1.0, no calibration")


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None,
                   help="model: 'smollm2' (the packaged default), a Hugging Face checkpoint "
                        "directory or a .gguf file")
    g.add_argument("--tokenizer", default=None, help="tokenizer path (default: the model's)")
    g.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda' or 'cuda:N'")
    g.add_argument("--dtype", default="auto",
                   help="'auto' (fp32 on CPU; the checkpoint's half type or bf16 on GPU), "
                        "'float32', 'float16' or 'bfloat16'")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="longest prompt + output in tokens (default: the model's context)")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and KV cache")
    g.add_argument("--kv-cache-space", type=float, default=None,
                   help="GiB of KV cache on the CPU (default 4)")
    g.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPE_CHOICES, default="auto",
                   help=KV_CACHE_DTYPE_HELP + " (default: auto)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    g.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per step (default 2048 on CPU, 8192 on GPU)")
    g.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching",
                   action="store_false", help="disable automatic prefix caching")
    g.add_argument("--no-enable-chunked-prefill", dest="enable_chunked_prefill",
                   action="store_false", help="disable chunked prefill")
    g.add_argument("--preemption-mode", choices=["recompute", "swap"], default="recompute",
                   help="what happens to a sequence preempted when KV blocks run out")
    g.add_argument("--swap-space", type=float, default=4.0,
                   help="GiB of host memory for swapped-out blocks (--preemption-mode swap)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="do not capture CUDA graphs for decode steps")
    g.add_argument("--seed", type=int, default=0, help="seed of the engine's random draws")


def engine_kwargs(args: argparse.Namespace) -> Dict[str, Any]:
    keys = ["tokenizer", "device", "dtype", "max_model_len", "block_size",
            "gpu_memory_utilization", "kv_cache_space", "kv_cache_dtype", "max_num_seqs",
            "max_num_batched_tokens",
            "enable_prefix_caching", "enable_chunked_prefill", "preemption_mode", "swap_space",
            "enforce_eager", "seed"]
    kw = {k: getattr(args, k) for k in keys}
    kw["model"] = args.model
    return kw


def add_sampling_arguments(parser: argparse.ArgumentParser, max_tokens: int = 128,
                           temperature: float = 0.7) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens to generate at most")
    g.add_argument("--temperature", type=float, default=temperature, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * max prob")
    g.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="> 1 discourages repeating prompt or output tokens")
    g.add_argument("--sampling-seed", type=int, default=None,
                   help="seed of this request's sampling (reproducible output)")
    g.add_argument("--stop", action="append", default=None,
                   help="stop string (repeat the flag for several)")


def sampling_params(args: argparse.Namespace, **overrides: Any) -> Any:
    from pagedkv.engine.sampling_params import SamplingParams

    kw = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
              top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
              seed=args.sampling_seed, stop=args.stop)
    kw.update(overrides)
    return SamplingParams(**kw)
