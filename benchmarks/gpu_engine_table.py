"""Issue #28's engine table: pagedkv (serial and overlapped loops), HF ``generate`` and HF
continuous batching on one GPU, side by side, with the decode step against its roofline and
the GPU-busy fraction of the decode phase.

Models: the random-weight ~1B Llama of benchmarks/throughput.py and a random Llama-3-8B-shaped
checkpoint (benchmarks/parallel_bench.py's writer), bf16, built once into --dir. Workloads
(greedy, EOS ignored, so every system emits exactly the requested tokens):
256x(128->256), 1024x(512->256), 256x(1024->128) and a ShareGPT-like mix (log-normal prompt
and output lengths, each request its own output length).

Columns, per model x workload:
  * output tok/s: pagedkv serial loop, pagedkv overlapped loop (async_scheduling), HF
    ``generate`` (one static batch of the first --hf-prompts requests, left-padded to the
    longest prompt and run to the longest output: padded work is not counted as output), HF
    continuous batching (``ContinuousBatchingManager``, the first --hf-cb-prompts requests;
    reported as failed, with the error, where the installed transformers lacks or breaks it).
    HF runs fewer requests than pagedkv to fit the time: its tok/s is at that smaller batch.
  * decode step ms: the mean host period of the overlapped run's decode-only steps (steps that
    scheduled no prefill), from one schedule() call to the next.
  * roofline step ms: for those same steps, max(bytes / copy bandwidth, FLOPs / GEMM rate),
    bytes = the weights read once (the embedding table excepted: only B rows of it are read)
    + the KV of every sequence's context read + the new KV written; FLOPs = 2 x weights x B +
    4 x context x query heads x head dim per layer; the card's copy bandwidth and bf16 GEMM
    rate are measured here first.
  * GPU busy: one extra overlapped (and one serial) run of 256x(128->256) per model with
    CUDA events around each step's launches (DeviceSpans; torch's profiler sees no kernels
    inside CUDA-graph replays): the device's busy share of the decode-only steps. A run it
    cannot measure raises instead of printing a number.

  python benchmarks/gpu_engine_table.py --dir /tmp/engine_table --out table.json
  (benchmarks/gpu_overlap_run.sh runs it in < 8 min on an H100 / H200.)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_bench import write_checkpoint  # noqa: E402
from throughput import load_hf, random_llama_1b  # noqa: E402

MODELS = ("1b", "8b")
WORKLOADS = ("256x128-256", "1024x512-256", "256x1024-128", "sharegpt-mix")
PROFILED = "256x128-256"  # the workload of the profiled runs (GPU busy)
MAX_MODEL_LEN = 2048


# ---------------------------------------------------------------------------------- workload
@dataclass
class Workload:
    name: str
    prompts: List[List[int]]
    output_lens: List[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def head(self, n: int) -> Workload:
        return Workload(self.name, self.prompts[:n], self.output_lens[:n])


def make_workload(name: str, vocab: int, seed: int) -> Workload:
    """``name``'s requests; ``seed`` draws other tokens of the same lengths (a run must not hit
    the prefix cache of the one before)."""
    rng = np.random.default_rng(seed)
    if name == "sharegpt-mix":
        # ShareGPT's lengths are roughly log-normal (median ~200 prompt tokens, a long tail);
        # clipped to the engine's max_model_len. The same lengths for every seed.
        n, lengths = 512, np.random.default_rng(0)
        ins = np.clip(lengths.lognormal(np.log(200), 1.0, n), 4, 1024).astype(int)
        outs = np.clip(lengths.lognormal(np.log(160), 0.9, n), 4, 768).astype(int)
    else:
        count, lens = name.split("x")
        n, (i, o) = int(count), map(int, lens.split("-"))
        ins, outs = np.full(n, i), np.full(n, o)
    prompts = [rng.integers(100, min(vocab, 30000), int(k)).tolist() for k in ins]
    return Workload(name, prompts, [int(k) for k in outs])


# ---------------------------------------------------------------------------------- card
def measure_card() -> Dict[str, float]:
    """The card's device-to-device copy bandwidth (bytes read + written per second) and bf16
    GEMM rate (FLOP/s), best of a few runs."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src))
    m = 8192
    a = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    gemm_s = _best_time(lambda: torch.mm(a, b))
    return {"copy_bytes_per_s": 2 * n / copy_s, "gemm_flops_per_s": 2 * m**3 / gemm_s}


def _best_time(fn: Callable[[], Any], reps: int = 10) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / reps)
    return best


@dataclass
class Shape:
    """What the roofline needs of a Llama-shaped config."""

    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool

    @classmethod
    def of(cls, model_dir: str) -> Shape:
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        h, nq = c["hidden_size"], c["num_attention_heads"]
        return cls(
            c["num_hidden_layers"],
            h,
            nq,
            c.get("num_key_value_heads", nq),
            c.get("head_dim") or h // nq,
            c["intermediate_size"],
            c["vocab_size"],
            bool(c.get("tie_word_embeddings", False)),
        )

    @property
    def step_weights(self) -> int:
        """Parameters one decode step reads whole (all but the embedding table's rows)."""
        h, d = self.hidden, self.head_dim
        attn = h * d * (2 * self.q_heads + 2 * self.kv_heads)
        layer = attn + 3 * h * self.ffn + 2 * h
        return self.layers * layer + h + self.vocab * h  # + final norm + LM head

    def roofline_s(self, batch: int, context: int, card: Dict[str, float]) -> float:
        """One decode step of ``batch`` sequences over ``context`` cached tokens in all, bf16."""
        kv_token = self.layers * 2 * self.kv_heads * self.head_dim * 2  # bytes per token
        bytes_ = 2 * self.step_weights + kv_token * (context + batch)
        flops = 2 * self.step_weights * batch
        flops += 4 * context * self.q_heads * self.head_dim * self.layers
        return max(bytes_ / card["copy_bytes_per_s"], flops / card["gemm_flops_per_s"])


# ---------------------------------------------------------------------------------- steps
@dataclass
class StepLog:
    """Each schedule() of the engine core: when (perf_counter), and for a decode-only step its
    batch and its sequences' cached tokens. Installed on the core instance (no engine code
    changes): one call and one small sum per step."""

    times: List[float] = field(default_factory=list)
    decode: List[Optional[Tuple[int, int]]] = field(default_factory=list)

    def install(self, core: Any) -> Callable[[], None]:
        inner = core._schedule

        def logged() -> Any:
            self.times.append(time.perf_counter())
            plan = inner()
            if plan is None or int(plan.num_prefills):
                self.decode.append(None)
            else:
                n = int(plan.num_seqs)
                self.decode.append((n, int(np.asarray(plan.context_lens)[:n].sum())))
            return plan

        core._schedule = logged
        return lambda: setattr(core, "_schedule", inner)

    def decode_windows(self, times: List[float], end: float) -> List[Tuple[float, float, int]]:
        """(start, end, index) of every decode-only step, each lasting until the next
        schedule() (the last until ``end``)."""
        bounds = list(times) + [end]
        return [(bounds[i], bounds[i + 1], i) for i, d in enumerate(self.decode) if d is not None]


def run_pagedkv(llm: Any, w: Workload, overlap: bool) -> Dict[str, Any]:
    from pagedkv import SamplingParams

    core = llm.llm_engine.core
    core.set_async_scheduling(overlap)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in w.output_lens]
    log = StepLog()
    restore = log.install(core)
    try:
        _sync()
        t0 = time.perf_counter()
        outs = llm.generate(w.prompts, params, use_tqdm=False)
        _sync()
        t1 = time.perf_counter()
    finally:
        restore()
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert tokens == w.output_tokens, (tokens, w.output_tokens)
    windows = log.decode_windows(log.times, t1)
    steps = [log.decode[i] for _, _, i in windows]
    return {
        "elapsed_s": t1 - t0,
        "output_tok_s": tokens / (t1 - t0),
        "decode_steps": len(windows),
        "decode_step_ms": 1e3 * float(np.mean([b - a for a, b, _ in windows])) if windows else None,
        "decode_batches": steps,
    }


class DeviceSpans:
    """CUDA events around each step's device work: the forward's launch (EngineCore._execute)
    and the sampling's (EngineCore._sample), each span from an event recorded just before the
    launch to one just after, on the step's stream. A CUDA-graph replay is one opaque launch
    to torch's profiler (it saw no kernels in the replays: "GPU busy 0.0%"); events see it.

    The device is busy from a span's start event to its end event (its work was all queued by
    then: the stream runs it back to back) and idle from one span's end to the next span's
    start exactly when the host had not launched the next work yet (an event on an idle
    stream completes when it is recorded). Installed on the core instance (no engine code
    changes): four events per step. The host work inside _execute / _sample before their
    launches (tens of microseconds: metadata, graph inputs, the sampling's rows) counts as busy
    where the device was idle then: the share is an upper bound by that much."""

    def __init__(self) -> None:
        # (start, end, decode-only step) per span, in stream order
        self.spans: List[Tuple[Any, Any, bool]] = []

    def install(self, core: Any) -> Callable[[], None]:
        execute, sample = core._execute, core._sample

        def spanned(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(plan: Any, *args: Any, **kwargs: Any) -> Any:
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                out = fn(plan, *args, **kwargs)
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self.spans.append((start, end, int(plan.num_prefills) == 0))
                return out

            return run

        core._execute, core._sample = spanned(execute), spanned(sample)

        def restore() -> None:
            core._execute, core._sample = execute, sample

        return restore

    def busy_decode(self) -> Dict[str, Any]:
        """The busy share of the device time of the decode-only steps' spans, each span's
        period running to the next span's start (the last one: to its own end)."""
        torch.cuda.synchronize()
        spans = [(a.elapsed_time(b), i, decode) for i, (a, b, decode) in enumerate(self.spans)]
        busy_ms = [ms for ms, _, decode in spans if decode]
        periods = [
            (self.spans[i][0].elapsed_time(self.spans[i + 1][0]) if i + 1 < len(spans) else ms)
            for ms, i, decode in spans
            if decode
        ]
        return busy_fraction(busy_ms, periods)


def busy_fraction(busy_ms: List[float], period_ms: List[float]) -> Dict[str, Any]:
    """sum(busy) / sum(period) over the decode spans; raises where that is not a measurement
    (no decode span, or a span busier than its period: events out of stream order)."""
    if not busy_ms or len(busy_ms) != len(period_ms):
        raise RuntimeError(f"GPU busy: {len(busy_ms)} decode spans, {len(period_ms)} periods")
    total, busy = float(sum(period_ms)), float(sum(busy_ms))
    if not total > 0 or any(b > p * (1 + 1e-3) + 1e-3 for b, p in zip(busy_ms, period_ms)):
        raise RuntimeError(f"GPU busy: device spans do not fit their periods ({busy} / {total} ms)")
    return {
        "gpu_busy_decode": busy / total,
        "decode_spans": len(busy_ms),
        "decode_device_ms": total,
        "decode_idle_ms": total - busy,
    }


def gpu_busy(llm: Any, w: Workload, overlap: bool) -> Dict[str, Any]:
    """One more run with CUDA events around each step's launches (DeviceSpans): the device's
    busy share of the decode-only steps, and the run's tok/s with the events in place."""
    from pagedkv import SamplingParams

    if not torch.cuda.is_available():
        raise RuntimeError("GPU busy needs CUDA (events on the device's stream)")
    core = llm.llm_engine.core
    core.set_async_scheduling(overlap)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in w.output_lens]
    spans = DeviceSpans()
    restore = spans.install(core)
    try:
        _sync()
        t0 = time.perf_counter()
        llm.generate(w.prompts, params, use_tqdm=False)
        _sync()
        wall = time.perf_counter() - t0
    finally:
        restore()
    return {**spans.busy_decode(), "profiled_tok_s": w.output_tokens / wall}


def _sync() -> None:
    if torch.cuda.is_available():  # (the CPU runs only check the script's logic)
        torch.cuda.synchronize()


# ---------------------------------------------------------------------------------- HF
def run_hf_generate(hf: Any, w: Workload) -> Dict[str, Any]:
    """One static batch, left-padded; every row runs to the longest output."""
    longest = max(len(p) for p in w.prompts)
    ids = torch.zeros(len(w.prompts), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(w.prompts):
        ids[i, longest - len(p) :] = torch.tensor(p)
        mask[i, longest - len(p) :] = 1
    ids, mask = ids.cuda(), mask.cuda()
    new = max(w.output_lens)

    def gen(n_rows: int, n_new: int) -> None:
        with torch.no_grad():
            hf.generate(
                ids[:n_rows],
                attention_mask=mask[:n_rows],
                do_sample=False,
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                pad_token_id=0,
            )

    gen(2, 4)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gen(len(w.prompts), new)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    return {
        "requests": len(w.prompts),
        "elapsed_s": elapsed,
        "output_tok_s": w.output_tokens / elapsed,
    }


def run_hf_cb(hf: Any, w: Workload) -> Dict[str, Any]:
    """transformers' continuous batching: each request with its own output length."""
    from transformers import GenerationConfig

    if not hasattr(hf, "init_continuous_batching"):
        return {"error": "this transformers has no continuous batching (init_continuous_batching)"}
    cfg = GenerationConfig(
        max_new_tokens=max(w.output_lens), do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    if len(set(w.output_lens)) == 1:  # one output length: the one-call API
        return _hf_generate_batch(hf, w, cfg)
    try:
        manager = hf.init_continuous_batching(generation_config=cfg)
        manager.start()
        try:
            _hf_cb_run(manager, w.head(2))  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens = _hf_cb_run(manager, w)
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
        finally:
            manager.stop(block=True, timeout=30)
    except Exception as e:  # the table says why the column is empty
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"requests": len(w.prompts), "elapsed_s": elapsed, "output_tok_s": tokens / elapsed}


def _hf_generate_batch(hf: Any, w: Workload, cfg: Any) -> Dict[str, Any]:
    try:
        hf.generate_batch(inputs=w.prompts[:2], generation_config=cfg)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = hf.generate_batch(inputs=w.prompts, generation_config=cfg)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
    except Exception as e:  # the table says why the column is empty
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    tokens = sum(len(r.generated_tokens) for r in res.values())
    return {"requests": len(w.prompts), "elapsed_s": elapsed, "output_tok_s": tokens / elapsed}


def _hf_cb_run(manager: Any, w: Workload) -> int:
    ids = [
        manager.add_request(p, max_new_tokens=n, request_id=f"r{time.monotonic_ns()}_{i}")
        for i, (p, n) in enumerate(zip(w.prompts, w.output_lens))
    ]
    pending, tokens = set(ids), 0
    deadline = time.monotonic() + 300
    while pending:
        out = manager.get_result(timeout=1.0)
        if out is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(pending)} requests unfinished")
            continue
        if out.request_id in pending and out.is_finished():
            pending.discard(out.request_id)
            tokens += len(out.generated_tokens)
    return tokens


# ---------------------------------------------------------------------------------- driver
def model_dir(name: str, root: str) -> str:
    path = os.path.join(root, f"llama-{name}")
    if name == "1b":
        return random_llama_1b(path)
    if not os.path.isfile(os.path.join(path, "model.safetensors.index.json")):
        t0 = time.perf_counter()
        write_checkpoint(path, "llama3-8b", "cuda", 0)
        print(f"built random llama3-8b in {path} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return path


def bench_model(name: str, args: argparse.Namespace, card: Dict[str, float]) -> Dict[str, Any]:
    from pagedkv import LLM

    path = model_dir(name, args.dir)
    shape = Shape.of(path)
    t0 = time.perf_counter()
    llm = LLM(
        path,
        device="cuda",
        dtype="bfloat16",
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=256,
        skip_tokenizer_init=True,
    )
    out: Dict[str, Any] = {"load_s": time.perf_counter() - t0, "workloads": {}}
    print(f"[{name}] pagedkv loaded in {out['load_s']:.0f} s", flush=True)
    vocab = shape.vocab
    for wname in args.workloads:
        warm = make_workload(wname, vocab, seed=100).head(16)
        run_pagedkv(llm, warm, True)
        row: Dict[str, Any] = {}
        for seed, (mode, overlap) in enumerate((("serial", False), ("async", True)), start=1):
            r = run_pagedkv(llm, make_workload(wname, vocab, seed), overlap)
            batches = r.pop("decode_batches")
            if batches:
                roof = [shape.roofline_s(b, c, card) for b, c in batches]
                r["roofline_step_ms"] = 1e3 * float(np.mean(roof))
                r["step_over_roofline"] = r["decode_step_ms"] / r["roofline_step_ms"]
            row[mode] = r
        if wname == PROFILED:
            for seed, (mode, overlap) in enumerate((("serial", False), ("async", True)), start=3):
                try:
                    row[mode]["profile"] = gpu_busy(llm, make_workload(wname, vocab, seed), overlap)
                except RuntimeError as e:  # said out loud; the rest of the table still runs
                    print(f"[{name}] GPU busy ({mode}) FAILED: {e}", file=sys.stderr, flush=True)
                    row[mode]["profile"] = {"error": str(e)}
        out["workloads"][wname] = row
        print(f"[{name}] {wname}: {json.dumps(row)}", flush=True)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    if not args.skip_hf:
        hf = load_hf(path, torch.bfloat16, "cuda")
        for wname in args.workloads:
            w = make_workload(wname, vocab, seed=1)
            row = out["workloads"][wname]
            for key, fn, n in (
                ("hf_generate", run_hf_generate, args.hf_prompts),
                ("hf_cb", run_hf_cb, args.hf_cb_prompts),
            ):
                try:
                    row[key] = fn(hf, w.head(n))
                except Exception as e:  # (out of memory, mostly): reported in the table
                    row[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
                    torch.cuda.empty_cache()
                print(f"[{name}] {wname} {key}: {json.dumps(row[key])}", flush=True)
        del hf
        gc.collect()
        torch.cuda.empty_cache()
    return out


def table(results: Dict[str, Any]) -> str:
    card = results["card"]
    lines = [
        f"{results['device']}: copy {card['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"bf16 GEMM {card['gemm_flops_per_s'] / 1e12:.0f} TFLOP/s",
        "",
        "| model | workload | pagedkv serial tok/s | pagedkv async tok/s | HF generate tok/s "
        "(reqs) | HF CB tok/s (reqs) | decode step ms (async) | roofline step ms | "
        "step / roofline | GPU busy decode serial / async |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def tps(r: Optional[Dict[str, Any]]) -> str:
        if not r:
            return "-"
        if "error" in r:
            return "failed: " + r["error"][:60]
        reqs = f" ({r['requests']})" if "requests" in r else ""
        return f"{r['output_tok_s'] / 1e3:.1f}k{reqs}"

    def num(v: Optional[float], fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for model, m in results["models"].items():
        for wname, row in m["workloads"].items():
            a, s = row["async"], row["serial"]
            busy = "-"
            if "profile" in a:
                busy = " / ".join(
                    "FAILED"
                    if "error" in r["profile"]
                    else num(r["profile"]["gpu_busy_decode"], ".1%")
                    for r in (s, a)
                )
            lines.append(
                f"| {model} | {wname} | {tps(s)} | {tps(a)} | {tps(row.get('hf_generate'))} | "
                f"{tps(row.get('hf_cb'))} | {num(a.get('decode_step_ms'), '.2f')} | "
                f"{num(a.get('roofline_step_ms'), '.2f')} | "
                f"{num(a.get('step_over_roofline'), '.2f')}x | {busy} |"
            )
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dir", default="/tmp/engine_table", help="where the random models live")
    ap.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--hf-prompts", type=int, default=64, help="requests HF generate runs")
    ap.add_argument("--hf-cb-prompts", type=int, default=32, help="requests HF CB runs")
    ap.add_argument("--skip-hf", action="store_true", help="pagedkv columns only")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.55)
    ap.add_argument("--out", default=None, help="write the results here (JSON)")
    args = ap.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for m in args.models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r}")
    for w in args.workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    return args


def main() -> None:
    args = parse_args()
    results: Dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "card": measure_card(),
        "hf_prompts": args.hf_prompts,
        "hf_cb_prompts": args.hf_cb_prompts,
        "models": {},
    }
    print(f"card: {json.dumps(results['card'])}", flush=True)
    for name in args.models:
        results["models"][name] = bench_model(name, args, results["card"])
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
        print(table(results), flush=True)  # (again after each model: a cut run keeps it)


if __name__ == "__main__":
    main()
