"""The engine's host time per decode step, by engine part, with the device work taken out.

With CUDA graphs the device replays the whole forward, so an overlapped step that lasts longer
than the device's work is host time: scheduling, the step's metadata and graph inputs, the
sampling launch, applying tokens, building outputs, the generate loop. This measures that host
work on the CPU: the model runner's execute is replaced by the host side of a CUDA-graph replay
(cuda_graph.fill_graph_inputs into host mirrors of the graphs' shapes) returning precomputed
hidden states, and the LM head by precomputed logits (their argmax, a few microseconds, is the
only "device" work left). Everything else is the engine's own code, run as LLM.generate runs it.

  python benchmarks/host_step.py                       # 256 x (4 -> 256), greedy, both loops
  python benchmarks/host_step.py --loops overlapped --json -
  python benchmarks/host_step.py --cprofile 25         # + the top functions by own time

Parts (exclusive microseconds per step: a part's time excludes the parts it calls, so the
parts and "other" add up to the step; each the least of --repeats runs, the total the
fastest run's, so on a loaded machine the parts may add up to less than the total):
  schedule       Scheduler.schedule (C++)
  entries        EngineCore._begin / _entries: the plan's sequences and first-scheduled times
  execute-glue   EngineCore._execute around the runner (LoRA ids, images, M-RoPE)
  graph-inputs   the host side of a graph replay (fill_graph_inputs); eager prefill: nothing
  sampling       EngineCore._sample: StepSampling (rows, argmax), forks, prompt logprobs; the
                 argmax runs here on the CPU ([batch, 64]: ~18 us at batch 256), a launch on a GPU
  logits         the LM head's stand-in: rows of precomputed logits (plus argmax in sampling)
  in-flight      overlapped: the handle of the launched step (its tokens' copy to the host)
  tokens-host    the step's tokens on the host (a device sync on a GPU)
  update         Scheduler.update / resolve / advance / would_finish (C++)
  apply          EngineCore._apply: tokens into request state, scheduler finishes
  outputs        OutputProcessor.process: metrics, stop checks, text, RequestOutputs
  admission      LLMEngine.add_request of the 256 requests, spread over the steps
  other          the rest of LLMEngine.step and LLM.generate's loop (wall / steps - parts)
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import tempfile
import time
import zlib
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch

PARTS = (
    "schedule",
    "entries",
    "execute-glue",
    "graph-inputs",
    "sampling",
    "logits",
    "in-flight",
    "tokens-host",
    "update",
    "apply",
    "outputs",
    "admission",
)


class PartTimer:
    """Exclusive time per part: a timed call nested in another is subtracted from its caller,
    so that the parts add up to the wall time they cover."""

    def __init__(self) -> None:
        self.totals: Dict[str, float] = collections.defaultdict(float)
        self._stack: List[List[Any]] = []  # [part, time spent in nested parts]

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [part, 0.0]
            self._stack.append(frame)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                self._stack.pop()
                self.totals[part] += took - frame[1]
                if self._stack:
                    self._stack[-1][1] += took

        return timed

    def clear(self) -> None:
        self.totals.clear()


class _TimedScheduler:
    """Forwards to the real scheduler, timing the calls the core makes per step."""

    def __init__(self, inner: Any, timer: PartTimer) -> None:
        self._inner = inner
        for name in ("schedule",):
            setattr(self, name, timer.wrap("schedule", getattr(inner, name)))
        for name in ("update", "resolve", "advance", "would_finish", "update_accepted"):
            setattr(self, name, timer.wrap("update", getattr(inner, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FakeDevice:
    """The runner's execute and LM head without their device work: a decode step fills the
    CUDA graphs' host mirrors (what CudaGraphRunner.run does on the host) and returns
    precomputed hidden states; the LM head returns precomputed logits rows."""

    def __init__(self, max_seqs: int, max_tokens: int, max_len: int, block_size: int) -> None:
        from pagedkv.engine.cuda_graph import capture_sizes

        g = torch.Generator().manual_seed(0)
        self.hidden = torch.randn(max_tokens, 8, generator=g)
        # Different rows, different argmax: requests do not all emit the same token.
        self.logits = torch.randn(max_tokens, 64, generator=g)
        self.sizes = capture_sizes(max_seqs)
        self.width = -(-max_len // block_size)
        self.block_size = block_size
        max_bs = self.sizes[-1]
        self.h64 = np.zeros((3, max_bs), dtype=np.int64)
        self.h32 = np.zeros(max_bs * (1 + self.width), dtype=np.int32)

    def execute(self, plan: Any, **_: Any) -> torch.Tensor:
        from pagedkv.engine.cuda_graph import fill_graph_inputs

        n = int(plan.num_seqs)
        if int(plan.num_prefills) == 0:
            bs = next(s for s in self.sizes if s >= n)
            fill_graph_inputs(plan, bs, self.h64, self.h32, self.width, self.block_size)
        return self.hidden[: int(plan.num_tokens)]

    def compute_logits(
        self, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None, upcast: bool = True
    ) -> torch.Tensor:
        return self.logits[: hidden.shape[0]] if rows is None else self.logits[rows]


def build_llm(args: argparse.Namespace, model_dir: str) -> Any:
    from pagedkv import LLM

    return LLM(
        model_dir,
        skip_tokenizer_init=True,  # as benchmarks/gpu_engine_table.py runs it
        device="cpu",
        dtype="float32",
        max_num_seqs=args.batch,
        kv_cache_space=0.25,
        max_model_len=args.input_len + args.output_len + 16,
    )


def instrument(llm: Any, timer: PartTimer) -> Callable[[], int]:
    """Patches the engine's parts with timers and the fake device; returns a step counter."""
    import pagedkv.engine.engine_core as engine_core

    eng = llm.llm_engine
    core = eng.core
    cfg = eng.config if hasattr(eng, "config") else None
    block_size = getattr(cfg, "block_size", 16) if cfg is not None else 16
    max_tokens = int(getattr(eng.runner, "max_num_batched_tokens", 8192))
    fake = FakeDevice(core.max_num_seqs, max_tokens, eng.runner.max_model_len, block_size)
    core.scheduler = _TimedScheduler(core.scheduler, timer)
    eng.runner.execute = timer.wrap("graph-inputs", fake.execute)
    eng.runner.compute_logits = timer.wrap("logits", fake.compute_logits)
    for name, part in (
        ("_begin", "entries"),
        ("_entries", "entries"),
        ("_execute", "execute-glue"),
        ("_sample", "sampling"),
        ("_in_flight", "in-flight"),
        ("_apply", "apply"),
    ):
        setattr(core, name, timer.wrap(part, getattr(core, name)))
    # The tokens' way to the host: StepSampling.host (serial), _InFlight.host_tokens.
    for cls, name in ((engine_core.StepSampling, "host"), (engine_core._InFlight, "host_tokens")):
        real = getattr(cls, name)
        setattr(cls, name, timer.wrap("tokens-host", real))
    out = eng.output_processor
    out.process = timer.wrap("outputs", out.process)
    eng.add_request = timer.wrap("admission", eng.add_request)
    steps = [0]
    real_step = eng.step

    def counted_step() -> Any:
        steps[0] += 1
        return real_step()

    eng.step = counted_step
    return lambda: steps[0]


def run_loop(
    llm: Any, timer: PartTimer, steps: Callable[[], int], args: argparse.Namespace, overlap: bool
) -> Dict[str, Any]:
    from pagedkv import SamplingParams

    llm.llm_engine.core.set_async_scheduling(overlap)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 64, args.input_len).tolist() for _ in range(args.batch)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:4], params, use_tqdm=False)  # warm-up
    runs: List[Dict[str, Any]] = []
    for _ in range(args.repeats):
        gc.collect()
        timer.clear()
        first = steps()
        profiler = cProfile.Profile() if args.cprofile else None
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        outs = llm.generate(prompts, params, use_tqdm=False)
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - t0
        n = steps() - first
        us = {k: 1e6 * timer.totals.get(k, 0.0) / n for k in PARTS}
        us["other"] = 1e6 * wall / n - sum(us.values())
        tokens = [o.outputs[0].token_ids for o in outs]
        r = {
            "loop": "overlapped" if overlap else "serial",
            "steps": n,
            "wall_s": wall,
            "step_us": 1e6 * wall / n,
            "us": us,
            "output_tokens": sum(len(t) for t in tokens),
            "tokens_crc": f"{zlib.crc32(repr(tokens).encode()):08x}",
        }
        if profiler is not None:
            buf = io.StringIO()
            pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.cprofile)
            r["cprofile"] = buf.getvalue()
        runs.append(r)
    if len({r["tokens_crc"] for r in runs}) != 1:
        raise RuntimeError("the repeats produced different tokens")
    # Each number is its minimum over the repeats: on a shared machine, the least disturbed
    # run of that part is the closest to its cost (the total is the fastest run's).
    best = min(runs, key=lambda r: r["wall_s"])
    best["us"] = {k: min(r["us"][k] for r in runs) for k in best["us"]}
    best["repeats"] = len(runs)
    return best


def table(results: List[Dict[str, Any]]) -> str:
    head = f"{'part (us/step)':<16}" + "".join(f"{r['loop']:>12}" for r in results)
    lines = [head]
    for k in PARTS + ("other",):
        lines.append(f"{k:<16}" + "".join(f"{r['us'][k]:>12.1f}" for r in results))
    lines.append(f"{'total':<16}" + "".join(f"{r['step_us']:>12.1f}" for r in results))
    lines.append(f"{'steps':<16}" + "".join(f"{r['steps']:>12d}" for r in results))
    lines.append(f"{'tokens crc':<16}" + "".join(f"{r['tokens_crc']:>12}" for r in results))
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--batch", type=int, default=256, help="requests (= max_num_seqs)")
    ap.add_argument("--input-len", type=int, default=4, help="prompt tokens per request")
    ap.add_argument("--output-len", type=int, default=256, help="new tokens per request")
    ap.add_argument(
        "--loops",
        default="serial,overlapped",
        help="comma-separated: serial, overlapped (async_scheduling)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per loop; the fastest is shown")
    ap.add_argument("--cprofile", type=int, default=0, help="print the top N functions too")
    ap.add_argument("--json", default=None, help="write the results as JSON here ('-': stdout)")
    ap.add_argument("--model-dir", default=None, help="the tiny random model (default: temp)")
    args = ap.parse_args()
    args.loops = [x for x in args.loops.split(",") if x]
    for loop in args.loops:
        if loop not in ("serial", "overlapped"):
            ap.error(f"unknown loop {loop!r}")
    return args


def main() -> None:
    args = parse_args()
    from pagedkv.testing import save_random_model

    torch.set_num_threads(1)  # host work is one thread; keep the argmax off a thread pool
    model_dir = args.model_dir or os.path.join(tempfile.gettempdir(), "pagedkv_host_step")
    if not os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        save_random_model(
            model_dir,
            "tiny-llama",
            tokenizer=False,
            vocab_size=64,
            hidden_size=32,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=32,
            max_position_embeddings=1024,
        )
    llm = build_llm(args, model_dir)
    timer = PartTimer()
    steps = instrument(llm, timer)
    results = [run_loop(llm, timer, steps, args, loop == "overlapped") for loop in args.loops]
    print(
        f"host time per step, {args.batch} x ({args.input_len} -> {args.output_len}), greedy, "
        "device work taken out",
        file=sys.stderr if args.json == "-" else sys.stdout,
    )
    print(table(results), file=sys.stderr if args.json == "-" else sys.stdout)
    for r in results:
        if "cprofile" in r:
            print(f"\n--- cProfile, {r['loop']} loop ---\n{r.pop('cprofile')}", file=sys.stderr)
    if args.json:
        text = json.dumps({"args": vars(args), "results": results}, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)


if __name__ == "__main__":
    main()
