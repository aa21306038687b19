"""Multi-LoRA throughput: generation tokens/s of a batch whose requests use 8 distinct rank-16
adapters (round robin) vs the same batch without adapters, on one engine per LoRA kernel
(random ~1B Llama): "dense" (all slots' GEMMs under a one-hot slot mask), "grouped_mm"
(torch._grouped_mm SGMV, bf16 on sm90+), "pagedkv_tiled" and "pagedkv" (the core's BGMV ops,
tiled variant and default) by default, one after the other in this run. ``--profile-steps N``
then profiles N decode steps of each engine (benchmarks/lora_profile.py's tables: top kernels,
per-step delta).

  python benchmarks/lora_bench.py --model-dir /tmp/llama1b --json lora.json
  python benchmarks/lora_bench.py --kernel pagedkv dense --profile-steps 20

The adapters are PEFT folders of random A/B matrices over q/k/v/o/gate/up/down, written here
(no peft needed). Target: the adapter batch at >= 0.8x the base batch's tokens/s.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from typing import Any

import torch


def write_adapter(out: str, cfg: dict, rank: int, seed: int) -> str:
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    shapes = {
        "self_attn.q_proj": (h, q),
        "self_attn.k_proj": (h, kv),
        "self_attn.v_proj": (h, kv),
        "self_attn.o_proj": (q, h),
        "mlp.gate_proj": (h, inter),
        "mlp.up_proj": (h, inter),
        "mlp.down_proj": (inter, h),
    }
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for mod, (fin, fout) in shapes.items():
            p = f"base_model.model.model.layers.{layer}.{mod}"
            tensors[f"{p}.lora_A.weight"] = torch.randn(rank, fin, generator=g) / fin**0.5
            tensors[f"{p}.lora_B.weight"] = torch.randn(fout, rank, generator=g) * 0.01
    os.makedirs(out, exist_ok=True)
    save_file(
        {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()},
        os.path.join(out, "adapter_model.safetensors"),
    )
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "bias": "none",
                "target_modules": [m.split(".")[1] for m in shapes],
            },
            f,
        )
    return out


def lora_workload(
    model_dir: str, preset: str, num_adapters: int, rank: int, num_prompts: int, prompt_len: int
) -> tuple[list, list]:
    """The LoRA benchmarks' workload: a random ``preset`` model in ``model_dir`` (written there,
    bf16, if absent), ``num_adapters`` random rank-``rank`` adapters beside it, and
    ``num_prompts`` random prompts of ``prompt_len`` token ids (seed 0)."""
    from pagedkv import LoRARequest
    from pagedkv.testing import save_random_model

    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        save_random_model(model_dir, preset, dtype=torch.bfloat16, tokenizer=False)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    loras = [
        LoRARequest(f"a{i}", i + 1, write_adapter(f"{model_dir}_lora{i}", cfg, rank, i))
        for i in range(num_adapters)
    ]
    g = torch.Generator().manual_seed(0)
    vocab = cfg["vocab_size"]
    prompts = [
        {"prompt_token_ids": torch.randint(10, vocab, (prompt_len,), generator=g).tolist()}
        for _ in range(num_prompts)
    ]
    return loras, prompts


def lora_llm(model_dir: str, num_adapters: int, rank: int, kernel: str, **kw: Any) -> Any:
    """An engine for ``num_adapters`` adapters of rank ``rank`` at once through ``kernel``
    (no prefix cache: every run computes its prompts)."""
    from pagedkv import LLM

    return LLM(
        model_dir,
        skip_tokenizer_init=True,
        enable_lora=True,
        max_loras=num_adapters,
        max_lora_rank=rank,
        lora_kernel=kernel,
        enable_prefix_caching=False,
        **kw,
    )


def _bench_kernel(args, kernel, prompts, params, per_prompt) -> dict:
    """base / LoRA / base-again tokens/s on one engine whose adapters run through ``kernel``."""
    llm = lora_llm(args.model_dir, args.num_adapters, args.rank, kernel)
    runner = llm.llm_engine.runner
    chosen = sorted({layer.kernel for layer in runner.lora.targets.layers})
    llm.generate(prompts[:8], params, use_tqdm=False, lora_request=per_prompt[:8])  # warm-up

    def run(lora_request) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora_request)
        torch.cuda.synchronize()
        return sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0)

    replays = runner.graphs.num_replays if runner.graphs is not None else 0
    row = {"layers_kernel": chosen, "base_tok_s": run(None), "lora_tok_s": run(per_prompt)}
    row["base_tok_s_again"] = run(None)
    row["ratio"] = row["lora_tok_s"] / max(row["base_tok_s"], row["base_tok_s_again"])
    row["graph_replays"] = (runner.graphs.num_replays if runner.graphs is not None else 0) - replays
    if args.profile_steps:
        from lora_profile import profile_llm, profile_params

        steps = args.profile_steps
        params = profile_params(steps)
        row["profile"] = profile_llm(llm, prompts, params, per_prompt, steps, 25)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="/tmp/llama1b")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument(
        "--kernel",
        nargs="+",
        default=["dense", "grouped_mm", "pagedkv_tiled", "pagedkv"],
        choices=("auto", "pagedkv", "pagedkv_tiled", "grouped_mm", "dense"),
        help="the engines' lora_kernel, one engine each, in this order",
    )
    ap.add_argument("--profile-steps", type=int, default=0, help="profile N decode steps")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from pagedkv import SamplingParams

    loras, prompts = lora_workload(
        args.model_dir, "llama-1b", args.num_adapters, args.rank, args.num_prompts, args.prompt_len
    )
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    per_prompt = [loras[i % len(loras)] for i in range(args.num_prompts)]
    result: dict = dict(
        adapters=args.num_adapters,
        rank=args.rank,
        prompts=args.num_prompts,
        device=torch.cuda.get_device_name(),
    )
    for kernel in args.kernel:
        result[kernel] = _bench_kernel(args, kernel, prompts, params, per_prompt)
        summary = {k: v for k, v in result[kernel].items() if k != "profile"}
        print(json.dumps({kernel: summary}), flush=True)
        if args.json:  # after each kernel: a run cut short keeps the kernels it finished
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        gc.collect()  # the engine of this kernel, before the next one takes the GPU memory
        torch.cuda.empty_cache()
    shown = {k: v for k, v in result.items() if not isinstance(v, dict)}
    shown.update({k: v["ratio"] for k, v in result.items() if isinstance(v, dict)})
    print(json.dumps(shown, indent=2))


if __name__ == "__main__":
    main()
