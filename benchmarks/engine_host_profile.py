"""Host-side cost of one engine step, by phase, on the CPU with a tiny random Llama.

On a GPU a decode step replays a CUDA graph, so what the host does around it (schedule, fill
the graph's inputs, pick the rows to sample, sample, update, build outputs) adds directly to
every step. A tiny model makes the forward cheap here, so the table shows that host work; the
last column puts each phase next to the step's device-side work measured in the same run
(the model forward and the logits matmul, "forward"), the peer the host time competes with.

  python benchmarks/engine_host_profile.py --batch-sizes 32,256

Phases (ms per step, averaged over every step of one generate call): schedule (C++), execute
(forward incl. input preparation), logits (lm_head), sampler (the general Sampler; absent when
the argmax fast path serves the batch), sampling-host (StepSampling minus logits/sampler:
row selection, argmax, copies), update (C++), accept (tokens into request state), outputs.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import tempfile
import time
import zlib
from typing import Any, Callable, Dict

import numpy as np


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch-sizes", default="32,256", help="comma-separated request counts")
    ap.add_argument("--input-len", type=int, default=16, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=64, help="generated tokens per request")
    ap.add_argument(
        "--model-dir",
        default=None,
        help="where to build the tiny random model (default: a temp dir)",
    )
    ap.add_argument(
        "--async-scheduling",
        choices=["on", "off"],
        default="on",
        help="the engine's loop: overlapped (the default) or serial",
    )
    return ap.parse_args()


def timed(totals: Dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - t0

    return wrapper


class _TimedScheduler:
    """Forwards to the real scheduler, timing schedule() and update() (overlapped: resolve()
    and advance(), its update in two halves)."""

    def __init__(self, inner: Any, totals: Dict[str, float]) -> None:
        self._inner = inner
        self.schedule = timed(totals, "schedule", inner.schedule)
        self.update = timed(totals, "update", inner.update)
        self.resolve = timed(totals, "update", inner.resolve)
        self.advance = timed(totals, "update", inner.advance)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def profile(model_dir: str, batch: int, args: argparse.Namespace) -> Dict[str, Any]:
    import pagedkv.engine.step_sampling as step_sampling
    from pagedkv import LLM, SamplingParams

    llm = LLM(
        model_dir,
        skip_tokenizer_init=True,
        device="cpu",
        dtype="float32",
        max_num_seqs=batch,
        kv_cache_space=0.25,
        max_model_len=args.input_len + args.output_len + 16,
        async_scheduling=args.async_scheduling == "on",
    )
    eng = llm.llm_engine
    totals: Dict[str, float] = collections.defaultdict(float)
    eng.core.scheduler = _TimedScheduler(eng.scheduler, totals)
    eng.runner.execute = timed(totals, "execute", eng.runner.execute)
    model = eng.runner.model
    model.compute_logits = timed(totals, "logits", model.compute_logits)
    eng.core.sampler = timed(totals, "sampler", eng.sampler)
    out = eng.output_processor
    out._collect_outputs = timed(totals, "outputs", out._collect_outputs)
    real_run = step_sampling.StepSampling.run
    step_sampling.StepSampling.run = timed(totals, "sampling", real_run)
    steps = [0]
    real_step = eng.step

    def counted_step() -> Any:
        steps[0] += 1
        return real_step()

    eng.step = timed(totals, "step", counted_step)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 500, args.input_len).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    try:
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        totals.clear()
        steps[0] = 0
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
    finally:
        step_sampling.StepSampling.run = real_run
    n = max(steps[0], 1)
    ms = {k: 1e3 * v / n for k, v in totals.items()}
    ms["sampling-host"] = ms.pop("sampling", 0.0) - ms.get("logits", 0.0) - ms.get("sampler", 0.0)
    inner = sum(
        ms.get(k, 0.0)
        for k in ("schedule", "execute", "logits", "sampler", "sampling-host", "update", "outputs")
    )
    ms["accept"] = ms.pop("step") - inner
    tokens = [o.outputs[0].token_ids for o in outs]
    return {
        "batch": batch,
        "steps": n,
        "wall_s": wall,
        "ms": ms,
        "tokens_crc": zlib.crc32(repr(tokens).encode()),
    }


def main() -> None:
    args = parse_args()
    from pagedkv.testing import save_random_model

    model_dir = args.model_dir or os.path.join(tempfile.gettempdir(), "pagedkv_host_profile")
    if not os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        save_random_model(
            model_dir,
            "tiny-llama",
            tokenizer=False,
            vocab_size=512,
            hidden_size=128,
            num_attention_heads=4,
            head_dim=32,
            max_position_embeddings=512,
        )
    order = [
        "schedule",
        "execute",
        "logits",
        "sampler",
        "sampling-host",
        "update",
        "accept",
        "outputs",
    ]
    host = ["schedule", "sampler", "sampling-host", "update", "accept", "outputs"]
    for b in [int(x) for x in args.batch_sizes.split(",")]:
        gc.collect()
        r = profile(model_dir, b, args)
        ms = r["ms"]
        forward = ms.get("execute", 0.0) + ms.get("logits", 0.0)
        print(
            f"\nbatch {b}: {r['steps']} steps, {r['wall_s']:.3f} s, output crc "
            f"{r['tokens_crc']:08x}"
        )
        print(f"{'phase':<16} {'ms/step':>8} {'x forward':>10}")
        for k in order:
            v = ms.get(k, 0.0)
            print(f"{k:<16} {v:>8.3f} {v / forward:>10.3f}")
        total = sum(ms.get(k, 0.0) for k in host)
        print(f"{'host (no fwd)':<16} {total:>8.3f} {total / forward:>10.3f}")


if __name__ == "__main__":
    main()
