"""Where a JSON-schema decode step's time goes, next to its unconstrained twin (issue #30's
"<= 5 % slower" target): per-step host time of the engine's parts, and a torch.profiler trace
of a few steps (top device and host ops, device-sync and copy calls per step, device-busy
fraction).

Modes, on one engine: ``plain`` (the twin: same prompts, temperature 0.8, max_tokens, EOS
ignored), ``json`` (every request under benchmarks/structured_throughput.py's schema) and
``json_noprefetch`` (the same with the bitmask prefetch off: every row is filled on the main
thread when the step samples, as before structured_bitmask.py). Host timers wrap the
engine's methods (total seconds per step, main thread and bitmask worker apart); the trace runs
separately so that its overhead does not enter the timers. Writes ``profile.json``, the
profiler tables and chrome traces to --out.

  python benchmarks/structured_profile.py --device cuda --out gpu_out/structperf
  python benchmarks/structured_profile.py --batch 8 --steps 6 --timed-steps 8   # CPU smoke

Both loops (serial and async_scheduling) run on one engine, one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from structured_throughput import SCHEMA, add_model_args, make_prompts  # noqa: E402

# Host methods timed (class path, attribute, label). Nested ones overlap their callers.
TIMED = [
    ("pagedkv.engine.engine_core.EngineCore", "step", "core.step"),
    ("pagedkv.engine.engine_core.EngineCore", "_execute", "prepare+launch"),
    ("pagedkv.engine.engine_core.EngineCore", "_sample", "sample (incl. waits)"),
    ("pagedkv.engine.engine_core.EngineCore", "_apply", "apply tokens (matchers accept)"),
    ("pagedkv.engine.engine_core._InFlight", "host_tokens", "wait tokens (overlapped)"),
    ("pagedkv.engine.step_sampling.StepSampling", "host", "wait tokens (serial)"),
    ("pagedkv.engine.sampler.Sampler", "__call__", "sampler"),
    ("pagedkv.engine.output_processor.OutputProcessor", "process", "output processing"),
    ("pagedkv.engine.structured_bitmask.StructuredBitmask", "prefetch", "bitmask.prefetch"),
    ("pagedkv.engine.structured_bitmask.StructuredBitmask", "accept_queued", "matchers accept"),
    ("pagedkv.engine.structured_bitmask.StructuredBitmask", "take", "bitmask.take"),
    ("pagedkv.engine.structured_bitmask.StructuredBitmask", "wait", "bitmask.wait (blocked)"),
    ("pagedkv.engine.structured_output.GrammarCache", "fill_rows", "xgrammar fill"),
    ("pagedkv.engine.structured_output.GrammarCache", "fill_bitmask", "fill_bitmask (sync)"),
    ("pagedkv.engine.structured_output.GrammarCache", "apply_bitmask", "bitmask apply (launch)"),
]
# Profiler keys counted per step (substrings): host waits for the device, copies, launches.
COUNTED = ("Synchronize", "Memcpy", "cudaHostAlloc", "cudaGraphLaunch", "cudaLaunchKernel")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_args(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20, help="decode steps traced per mode")
    ap.add_argument("--timed-steps", type=int, default=64, help="decode steps timed per mode")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument(
        "--loops", default="serial,async", help="serial, async (async_scheduling) or both"
    )
    ap.add_argument("--out", default="structperf_out")
    return ap.parse_args()


class HostTimers:
    """Wraps TIMED methods: seconds and calls per label, main thread and other threads apart."""

    def __init__(self) -> None:
        self.total: Dict[str, float] = {}
        self.calls: Dict[str, int] = {}
        self._undo: List[Tuple[Any, str, Any]] = []
        self.on = False

    def install(self) -> None:
        import importlib

        main = threading.main_thread()
        for path, attr, label in TIMED:
            mod, cls_name = path.rsplit(".", 1)
            try:
                cls = getattr(importlib.import_module(mod), cls_name)
                real = getattr(cls, attr)
            except (ImportError, AttributeError):
                continue  # (an older install without that part)
            setattr(cls, attr, self._timed(real, label, main))
            self._undo.append((cls, attr, real))

    def _timed(self, real: Callable, label: str, main: Any) -> Callable:
        def timed(*a: Any, **kw: Any) -> Any:
            if not self.on:
                return real(*a, **kw)
            t0 = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                key = label if threading.current_thread() is main else f"{label} [worker]"
                self.total[key] = self.total.get(key, 0.0) + time.perf_counter() - t0
                self.calls[key] = self.calls.get(key, 0) + 1

        return timed

    def reset(self) -> None:
        self.total, self.calls = {}, {}


def params_for(mode: str, steps: int) -> Any:
    from pagedkv import SamplingParams, StructuredOutputsParams

    base = {"temperature": 0.8, "max_tokens": steps, "ignore_eos": True, "seed": 0}
    if mode == "plain":
        return SamplingParams(**base)
    return SamplingParams(**base, structured_outputs=StructuredOutputsParams(json=SCHEMA))


def set_prefetch(llm: Any, on: bool) -> None:
    bitmask = getattr(llm.llm_engine.core, "bitmask", None)
    if bitmask is None:
        return
    if on:
        bitmask.__dict__.pop("prefetch", None)
    else:
        bitmask.prefetch = lambda seqs: None  # every row is filled when the step samples


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_run(llm: Any, timers: HostTimers, prompts: List[str], mode: str, args: Any) -> Dict:
    params = params_for(mode, args.timed_steps)
    llm.generate(prompts, params, use_tqdm=False)  # warm-up of this shape
    timers.reset()
    sync(args.device)
    timers.on = True
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync(args.device)
    wall = time.perf_counter() - t0
    timers.on = False
    lengths = [len(o.outputs[0].token_ids) for o in outs]
    steps = max(lengths)
    return {
        "wall_s": round(wall, 4),
        "steps": steps,
        "ms_per_step": round(1e3 * wall / steps, 3),
        "tokens": sum(lengths),
        "all_rows_full_length": min(lengths) == steps,
        "host_ms_per_step": {
            k: round(1e3 * v / steps, 3)
            for k, v in sorted(timers.total.items(), key=lambda x: -x[1])
        },
        "calls_per_step": {k: round(v / steps, 2) for k, v in timers.calls.items()},
    }


def traced_run(llm: Any, prompts: List[str], mode: str, tag: str, args: Any) -> Dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    params = params_for(mode, args.steps)
    llm.generate(prompts, params, use_tqdm=False)
    acts = [ProfilerActivity.CPU]
    if args.device.startswith("cuda"):
        acts.append(ProfilerActivity.CUDA)
    sync(args.device)
    t0 = time.perf_counter()
    with profile(activities=acts) as prof:
        llm.generate(prompts, params, use_tqdm=False)
        sync(args.device)
    wall = time.perf_counter() - t0
    steps = args.steps + 1  # (+ the prefill)
    prof.export_chrome_trace(os.path.join(args.out, f"trace_{tag}.json"))
    avgs = prof.key_averages()
    with open(os.path.join(args.out, f"ops_{tag}.txt"), "w", encoding="utf-8") as f:
        if len(acts) > 1:
            f.write(avgs.table(sort_by="self_device_time_total", row_limit=20) + "\n")
        f.write(avgs.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")
    counted = {}
    device_us = 0.0
    for e in avgs:
        dev_self = float(getattr(e, "self_device_time_total", 0) or 0)
        if e.device_type == DeviceType.CUDA:
            device_us += dev_self  # kernels and copies as the device ran them
        if any(c in e.key for c in COUNTED):
            counted[e.key] = {
                "per_step": round(e.count / steps, 2),
                "host_us_per_step": round(e.self_cpu_time_total / steps, 1),
                "device_us_per_step": round(dev_self / steps, 1),
            }
    return {
        "traced_steps": steps,
        "wall_ms_per_step": round(1e3 * wall / steps, 3),
        "device_busy_fraction": round(device_us / 1e6 / wall, 3) if len(acts) > 1 else None,
        "counted": counted,
    }


def main() -> None:
    args = parse_args()
    os.makedirs(args.out, exist_ok=True)
    timers = HostTimers()
    timers.install()
    from pagedkv import LLM

    kw: Dict[str, Any] = {"device": args.device, "max_model_len": args.max_model_len}
    if args.device == "cpu":
        kw["kv_cache_space"] = 1.0
    if args.tokenizer:
        kw["tokenizer"] = args.tokenizer
    llm = LLM(args.model, **kw) if args.model else LLM(**kw)
    prompts = make_prompts(args.batch)
    llm.generate(prompts, params_for("json", 8), use_tqdm=False)  # grammar compiled
    result: Dict[str, Any] = {"device": args.device, "batch": args.batch}
    result["has_prefetch"] = getattr(llm.llm_engine.core, "bitmask", None) is not None
    for loop in args.loops.split(","):
        llm.llm_engine.core.set_async_scheduling(loop == "async")
        result[loop] = run_loop(llm, timers, prompts, loop, args)
    with open(os.path.join(args.out, "profile.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


def run_loop(llm: Any, timers: HostTimers, prompts: List[str], loop: str, args: Any) -> Dict:
    """The three modes on one loop (serial or async), printed and returned."""
    result: Dict[str, Any] = {}
    for mode in ("plain", "json", "json_noprefetch"):
        set_prefetch(llm, mode != "json_noprefetch")
        name = "json" if mode == "json_noprefetch" else mode
        result[mode] = {"timed": timed_run(llm, timers, prompts, name, args)}
        result[mode]["traced"] = traced_run(llm, prompts, name, f"{loop}_{mode}", args)
    set_prefetch(llm, True)
    plain = result["plain"]["timed"]["ms_per_step"]
    print(f"== {loop} loop, batch {args.batch}")
    for mode in ("plain", "json", "json_noprefetch"):
        r = result[mode]
        slower = 100.0 * (r["timed"]["ms_per_step"] / plain - 1.0)
        print(
            f"{mode:16s} {r['timed']['ms_per_step']:7.3f} ms/step ({slower:+.1f} % vs plain), "
            f"device busy {r['traced']['device_busy_fraction']}"
        )
        top = list(r["timed"]["host_ms_per_step"].items())[:12]
        print("   host ms/step: " + ", ".join(f"{k} {v}" for k, v in top))
        syncs = {k: v["per_step"] for k, v in r["traced"]["counted"].items()}
        print(f"   per step: {syncs}")
    return result


if __name__ == "__main__":
    main()
