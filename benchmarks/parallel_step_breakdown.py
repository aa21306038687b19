"""Where one decode step's host time goes on the driver and on a worker of a TP/PP engine.

On the CPU (gloo) with a tiny model, so the per-step plumbing is what shows. The benchmark
wraps (in its own processes only: the driver, and each spawned worker through a wrapper of
the worker's entry point) the functions a step passes through with wall-clock timers, runs
greedy decode at a few batch sizes, and prints each function's time per decode step on the
driver (rank 0) and on a worker (rank 1). Nested entries include their children (e.g. the
driver's ``executor.execute`` = ``send`` + its own ``worker.execute``); ``collective`` is the
time inside the model's all-reduces / all-gathers, i.e. mostly waiting for the peer.

  PYTHONPATH=python python3 benchmarks/parallel_step_breakdown.py [--tp 2] [--pp 1]
      [--batches 1 32] [--steps 32] [--async-scheduling]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_step_overhead import save_step_model, step_llm, step_prompts  # noqa: E402

Timings = Dict[str, List[float]]
_TIMES: Timings = collections.defaultdict(list)
_KEYS: List[str] = []  # in the order they were installed (the report's order)
_OUT_DIR = ""


def _wrap(owner: Any, attr: str, key: str) -> None:
    """Times every call of ``owner.attr`` under ``key``."""
    fn = getattr(owner, attr)
    if getattr(fn, "_timed", False):
        return

    @functools.wraps(fn)
    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            _TIMES[key].append(time.perf_counter() - t0)

    timed._timed = True  # type: ignore[attr-defined]
    _KEYS.append(key)
    setattr(owner, attr, timed)


def _install(driver: bool) -> None:
    from pagedkv.distributed import parallel_state
    from pagedkv.engine import command_channel, command_codec, worker
    from pagedkv.engine.cuda_graph import CudaGraphRunner
    from pagedkv.engine.model_runner import ModelRunner
    from pagedkv.engine.plan_arrays import PlanArrays

    gc = parallel_state.GroupCoordinator
    _wrap(gc, "all_reduce", "collective: all_reduce")
    _wrap(gc, "all_gather", "collective: all_gather")
    _wrap(worker.Worker, "execute", "worker.execute")
    _wrap(worker.Worker, "compute_logits", "worker.compute_logits")
    _wrap(ModelRunner, "_execute", "  runner._execute (forward)")
    _wrap(CudaGraphRunner, "run", "  graph replay")
    _wrap(ModelRunner, "compute_logits", "  runner.compute_logits")
    if driver:
        from pagedkv.engine import engine_core, executor_mp, llm_engine, step_sampling

        _wrap(llm_engine.LLMEngine, "step", "LLMEngine.step")
        _wrap(engine_core.EngineCore, "step", " EngineCore.step")
        _wrap(engine_core.EngineCore, "_schedule", "  schedule")
        _wrap(engine_core.EngineCore, "_execute", "  execute")
        _wrap(executor_mp.MultiprocExecutor, "execute", "   executor.execute")
        _wrap(executor_mp.MultiprocExecutor, "compute_logits", "   executor.compute_logits")
        _wrap(step_sampling.StepSampling, "run", "  sample (StepSampling.run)")
        _wrap(engine_core.EngineCore, "_apply", "  apply")
        _wrap(command_channel.ShmChannel, "send", "    send (encode + ring write)")
        _wrap(command_codec, "encode", "     encode")
        _wrap(PlanArrays, "from_plan", "    PlanArrays.from_plan")
    else:
        _wrap(command_channel.ShmChannel, "recv", "recv (wait + decode)")
        _wrap(command_codec, "decode", " decode")


def _dump(rank: int) -> None:
    with open(os.path.join(_OUT_DIR, f"rank{rank}.json"), "w") as f:
        json.dump(_TIMES, f)


def _timed_worker_process(out_dir: str, *args: Any) -> None:
    """The spawned rank's entry point with the timers in place; writes them when it ends."""
    global _OUT_DIR
    from pagedkv.engine import executor_mp

    _OUT_DIR = out_dir
    _install(driver=False)
    try:
        executor_mp._worker_process(*args)  # (the child's module is unpatched)
    finally:
        _dump(args[1])


def run(tp: int, pp: int, batches: List[int], steps: int, overlap: bool) -> None:
    from pagedkv import SamplingParams
    from pagedkv.engine import executor_mp

    global _OUT_DIR
    torch.set_num_threads(1)
    _install(driver=True)
    with tempfile.TemporaryDirectory() as tmp:
        _OUT_DIR = tmp
        executor_mp._worker_process = functools.partial(_timed_worker_process, tmp)  # type: ignore[assignment]
        path = save_step_model(os.path.join(tmp, "m"))
        llm = step_llm(
            path,
            max(batches),
            tensor_parallel_size=tp,
            pipeline_parallel_size=pp,
            async_scheduling=overlap,
        )
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
        warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
        marks = []
        for bs in batches:
            prompts = step_prompts(bs)
            llm.generate(prompts, warm, use_tqdm=False)
            start = {k: len(v) for k, v in _TIMES.items()}
            t0 = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t0
            marks.append((bs, start, {k: len(v) for k, v in _TIMES.items()}, wall))
        del llm
        import gc

        gc.collect()
        time.sleep(0.5)
        workers = {}
        for r in range(1, tp * pp):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                workers[r] = json.load(f)
    _report(f"TP={tp} PP={pp} async_scheduling={overlap}", marks, workers.get(1, {}))


def _report(title: str, marks: List[Any], worker: Dict[str, List[float]]) -> None:
    drv = dict(_TIMES)
    # Align the worker's record with the driver's by worker.execute calls (both ranks run
    # every step's execute; the driver's own record has them too).
    key = "worker.execute"
    for bs, start, end, wall in marks:
        a, b = start.get(key, 0), end.get(key, 0)
        n = b - a  # steps of this run (prefill + decodes)
        print(f"\n== {title} batch {bs}: {n} steps, {1e3 * wall / n:.2f} ms per step")
        print(f"{'driver (rank 0)':44s} us/step  calls")
        for k in sorted(drv, key=_order):
            v = drv[k][start.get(k, 0) : end.get(k, 0)]
            if v:
                print(f"  {k:42s} {1e6 * sum(v) / n:8.1f} {len(v):5d}")
        if worker:
            # The worker's calls of a run: those between its a-th and b-th worker.execute.
            w_exec = worker.get(key, [])
            print(f"{'worker (rank 1)':44s} us/step  calls")
            for k in sorted(worker, key=_order):
                v = worker[k]
                lo, hi = _slice(len(v), len(w_exec), a, b)
                part = v[lo:hi]
                if part:
                    print(f"  {k:42s} {1e6 * sum(part) / n:8.1f} {len(part):5d}")


def _slice(n_calls: int, n_exec: int, a: int, b: int) -> Tuple[int, int]:
    """Calls a..b of worker.execute map to the same fraction of another timer's calls (each
    timer is called a fixed number of times per step in a decode run)."""
    if n_exec == 0:
        return 0, 0
    per = n_calls / n_exec
    return round(a * per), round(b * per)


def _order(key: str) -> int:
    if key in _KEYS:
        return _KEYS.index(key)
    return -2 if key.startswith("recv") else -1  # (the worker's own timers come first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--async-scheduling", action="store_true", help="the overlapped loop")
    args = ap.parse_args()
    run(args.tp, args.pp, args.batches, args.steps, args.async_scheduling)


if __name__ == "__main__":
    main()
