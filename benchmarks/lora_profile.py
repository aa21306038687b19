"""Where the LoRA decode step's time goes: ~20 decode steps of a batch of 256 requests (random 1B
Llama, 8 distinct rank-16 adapters over q/k/v/o/gate/up/down, as benchmarks/lora_bench.py) with
and without adapters, each under torch.profiler, on one engine per LoRA kernel. Prints the top
GPU kernels by total time of each run, the per-step GPU time and wall time of both runs, and the
kernels whose per-step time grew most with the adapters (the delta table).

  python benchmarks/lora_profile.py --kernel dense grouped_mm pagedkv --json lora_profile.json
  python benchmarks/lora_profile.py --eager      # without CUDA graphs (one launch per kernel)

The prefills run before the profiler starts: only decode steps are measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_bench import lora_llm, lora_workload  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _kernel_times(prof: Any) -> tuple[dict[str, float], dict[str, int]]:
    """Total microseconds and launch count of each GPU kernel / memcpy / memset name (on a
    machine without CUDA, a smoke run: the aten ops instead)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    cuda = torch.cuda.is_available()
    for evt in prof.events():
        on_gpu = str(getattr(evt, "device_type", "")).endswith("CUDA")
        if on_gpu if cuda else evt.name.startswith("aten::"):
            total[evt.name] += evt.time_range.elapsed_us()
            count[evt.name] += 1
    return dict(total), dict(count)


def _decode_steps(llm: Any, prompts: list, params: Any, loras: Optional[list], steps: int) -> dict:
    """Adds the batch, steps through its prefills (and 3 warm-up decodes) unprofiled, then
    profiles ``steps`` decode steps; the remaining requests are aborted."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)

    eng = llm.llm_engine
    ids = [f"p{i}" for i in range(len(prompts))]
    for i, (rid, prompt) in enumerate(zip(ids, prompts)):
        eng.add_request(rid, prompt, params, lora_request=None if loras is None else loras[i])
    decoding = 0
    for _ in range(1000):  # a decode step gives every running request a token
        decoding = decoding + 1 if len(eng.step()) == len(prompts) else 0
        if decoding == 3:
            break
    else:
        raise RuntimeError("the batch never reached steady decode steps")
    _sync()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        _sync()
        wall = time.perf_counter() - t0
    eng.abort_request(ids)
    while eng.has_unfinished_requests():
        eng.step()
    total, count = _kernel_times(prof)
    return {"wall_ms_per_step": 1e3 * wall / steps, "total_us": total, "count": count}


def _top(run: dict, steps: int, n: int) -> list[dict]:
    rows = sorted(run["total_us"].items(), key=lambda kv: -kv[1])[:n]
    return [
        {
            "us_per_step": round(us / steps, 2),
            "launches_per_step": run["count"][name] / steps,
            "kernel": name[:110],
        }
        for name, us in rows
    ]


def _delta(base: dict, lora: dict, steps: int, n: int) -> list[dict]:
    names = set(base["total_us"]) | set(lora["total_us"])
    rows = []
    for name in names:
        d = (lora["total_us"].get(name, 0.0) - base["total_us"].get(name, 0.0)) / steps
        dl = (lora["count"].get(name, 0) - base["count"].get(name, 0)) / steps
        rows.append({"delta_us_per_step": round(d, 2), "delta_launches": dl, "kernel": name[:110]})
    rows.sort(key=lambda r: -abs(r["delta_us_per_step"]))
    return rows[:n]


def _print_table(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}")
    for r in rows:
        vals = [v for k, v in r.items() if k != "kernel"]
        print("  " + "  ".join(f"{v:>10.2f}" for v in vals) + "  " + r["kernel"])


def profile_llm(
    llm: Any, prompts: list, params: Any, per_prompt: list, steps: int, top: int
) -> dict:
    """Profiles ``steps`` decode steps of ``prompts`` without and then with the adapters
    ``per_prompt`` (one per prompt) on ``llm``; prints and returns the tables."""
    runner = llm.llm_engine.runner
    chosen = sorted({layer.kernel for layer in runner.lora.targets.layers})
    runs = {
        "base": _decode_steps(llm, prompts, params, None, steps),
        "lora": _decode_steps(llm, prompts, params, per_prompt, steps),
    }
    per_step = {
        mode: {
            "wall_ms": round(run["wall_ms_per_step"], 3),
            "gpu_kernel_ms": round(sum(run["total_us"].values()) / steps / 1e3, 3),
            "launches": sum(run["count"].values()) / steps,
        }
        for mode, run in runs.items()
    }
    out = {
        "layers_kernel": chosen,
        "per_step": per_step,
        "wall_ratio": per_step["base"]["wall_ms"] / per_step["lora"]["wall_ms"],
        "top_base": _top(runs["base"], steps, top),
        "top_lora": _top(runs["lora"], steps, top),
        "delta": _delta(runs["base"], runs["lora"], steps, top),
    }
    print(f"\n##### decode-step profile, LoRA layers' kernel: {chosen}")
    print(json.dumps({"per_step": per_step, "wall_ratio": round(out["wall_ratio"], 3)}))
    if per_step["lora"]["launches"] < 10:
        print("  (few kernels seen: this profiler may not trace CUDA graph replays; try --eager)")
    _print_table("top kernels, base (us/step, launches/step)", out["top_base"])
    _print_table("top kernels, LoRA (us/step, launches/step)", out["top_lora"])
    _print_table("LoRA - base per step (us, launches)", out["delta"])
    return out


def profile_params(steps: int) -> Any:
    """Greedy, long enough that no request finishes inside the profiled steps."""
    from pagedkv import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=steps + 64, ignore_eos=True)


def _profile_kernel(args: Any, kernel: str, loras: list, prompts: list) -> dict:
    llm = lora_llm(args.model_dir, args.num_adapters, args.rank, kernel, enforce_eager=args.eager)
    per_prompt = [loras[i % len(loras)] for i in range(len(prompts))]
    print(f"\n##### lora_kernel={kernel} eager={args.eager}")
    out = profile_llm(llm, prompts, profile_params(args.steps), per_prompt, args.steps, args.top)
    del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="/tmp/llama1b")
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--num-adapters", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--kernel", nargs="+", default=["auto"])
    ap.add_argument("--preset", default="llama-1b", help="pagedkv.testing preset of a new model")
    ap.add_argument("--eager", action="store_true", help="enforce_eager: no CUDA graphs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    loras, prompts = lora_workload(
        args.model_dir, args.preset, args.num_adapters, args.rank, args.num_prompts, args.prompt_len
    )
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (smoke run)"
    result: dict = {"device": device, "eager": args.eager}
    for kernel in args.kernel:
        result[kernel] = _profile_kernel(args, kernel, loras, prompts)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
