"""Load generator for the OpenAI-compatible server (streaming /v1/completions over httpx).

Modes:
  load (default)   Poisson arrivals at --request-rate (inf: all at once), optionally capped at
                   --max-concurrency; reports throughput, TTFT, inter-token latency (ITL) and
                   end-to-end latency p50/p99. With --compare-offline it then runs the same
                   prompts through LLMEngine in-process (server stopped first) and prints the
                   server/offline throughput ratio: the serving stack's overhead.
  disconnect       --disconnect-check: 64 concurrent streaming clients, every 4th hangs up after
                   a few chunks; checks that no other request failed and that, afterwards,
                   /metrics shows no running request and KV-cache usage 0. Exit status 1 if not.

  python benchmarks/serving.py --launch --num-prompts 32 --request-rate 4 --compare-offline
  python benchmarks/serving.py --url http://127.0.0.1:8000 --disconnect-check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import httpx
from pagedkv.entrypoints.engine_args import ENGINE_FLAGS

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "an",
    "were",
    "are",
    "which",
    "this",
    "be",
    "or",
    "had",
    "not",
    "but",
    "what",
    "all",
    "when",
    "there",
    "can",
    "more",
    "one",
    "time",
    "year",
    "people",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
]


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: Optional[float] = None
    itl: List[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int = 0
    disconnected: bool = False


def make_prompts(n: int, input_len: int, seed: int) -> List[str]:
    rng = random.Random(seed)
    # ~1 token per common English word for a BPE tokenizer; close enough for load shaping.
    return [" ".join(rng.choice(WORDS) for _ in range(input_len)) for _ in range(n)]


async def one_request(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    prompt: str,
    hang_up_after: Optional[int] = None,
) -> Result:
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    res = Result()
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    res.ok = True
                    break
                data = json.loads(line[6:])
                if "error" in data:
                    res.error = str(data["error"])
                    break
                if data.get("usage"):
                    res.output_tokens = data["usage"]["completion_tokens"]
                    res.prompt_tokens = data["usage"]["prompt_tokens"]
                if data["choices"] and data["choices"][0]["text"]:
                    now = time.perf_counter()
                    if res.ttft is None:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
                    if hang_up_after is not None and chunks >= hang_up_after:
                        res.disconnected = True
                        break  # leaving the block closes the connection mid-stream
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.latency = time.perf_counter() - start
    return res


async def run_load(args: argparse.Namespace, prompts: List[str]) -> tuple[List[Result], float]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sem = asyncio.Semaphore(args.max_concurrency or len(prompts))
    rng = random.Random(args.seed)

    async with httpx.AsyncClient(
        base_url=args.url, timeout=600, limits=limits, headers=headers
    ) as client:

        async def limited(p: str) -> Result:
            async with sem:
                return await one_request(client, args, p)

        tasks = []
        start = time.perf_counter()
        for p in prompts:
            tasks.append(asyncio.create_task(limited(p)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return list(results), time.perf_counter() - start


def pct(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def report(results: List[Result], elapsed: float) -> Dict[str, float]:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    lat = [r.latency for r in ok]
    stats = {
        "requests ok / sent": f"{len(ok)} / {len(results)}",
        "duration (s)": elapsed,
        "request throughput (req/s)": len(ok) / elapsed,
        "output throughput (tok/s)": out_tokens / elapsed,
        "total throughput (tok/s)": (in_tokens + out_tokens) / elapsed,
        "TTFT p50 (ms)": 1e3 * pct(ttft, 50),
        "TTFT p99 (ms)": 1e3 * pct(ttft, 99),
        "ITL p50 (ms)": 1e3 * pct(itl, 50),
        "ITL p99 (ms)": 1e3 * pct(itl, 99),
        "e2e p50 (s)": pct(lat, 50),
        "e2e p99 (s)": pct(lat, 99),
        "mean TPOT (ms)": 1e3 * statistics.mean(itl) if itl else float("nan"),
    }
    for k, v in stats.items():
        print(f"  {k:<28} {v:.3f}" if isinstance(v, float) else f"  {k:<28} {v}")
    for r in results:
        if not r.ok:
            print(f"  FAILED: {r.error}")
            break
    return {k: v for k, v in stats.items() if isinstance(v, float)}


def metrics(url: str) -> Dict[str, float]:
    values: Dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        m = re.match(r"^(pagedkv:[a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)$", line)
        if m:
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(2))
    return values


async def run_disconnect(args: argparse.Namespace) -> bool:
    prompts = make_prompts(64, args.input_len, args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(
        base_url=args.url, timeout=600, headers=headers, limits=httpx.Limits(max_connections=200)
    ) as client:
        results = await asyncio.gather(
            *[
                one_request(client, args, p, hang_up_after=2 + i % 5 if i % 4 == 0 else None)
                for i, p in enumerate(prompts)
            ]
        )
    stayed = [r for r in results if not r.disconnected]
    failed = [r for r in stayed if not r.ok or r.output_tokens != args.output_len]
    left = sum(r.disconnected for r in results)
    deadline = time.monotonic() + 30
    while True:
        m = metrics(args.url)
        idle = (
            m["pagedkv:num_requests_running"] == 0
            and m["pagedkv:num_requests_waiting"] == 0
            and m["pagedkv:kv_cache_usage_perc"] == 0
        )
        if idle or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    print(
        f"  clients: 64, hung up mid-stream: {left}, completed: {len(stayed) - len(failed)}, "
        f"failed: {len(failed)}"
    )
    print(
        f"  after: running={m['pagedkv:num_requests_running']:.0f} "
        f"waiting={m['pagedkv:num_requests_waiting']:.0f} "
        f"kv_cache_usage={m['pagedkv:kv_cache_usage_perc']:.4f} "
        f"preemptions={m['pagedkv:num_preemptions_total']:.0f}"
    )
    for r in failed[:3]:
        print(f"  FAILED: {r.error or f'{r.output_tokens} tokens'}")
    ok = not failed and idle
    print("  PASS" if ok else "  FAIL")
    return ok


def offline(args: argparse.Namespace, prompts: List[str]) -> float:
    """Output tokens/s of the same prompts through LLMEngine in this process (no HTTP).

    Like the server, it builds the engine in the main thread and steps it in a worker thread:
    on an oversubscribed CPU, torch's OpenMP team is several times slower when stepped from
    the thread that created it (measured here: 3.5 s vs 0.58 s per decode step), which would
    make the comparison about threads instead of the serving stack."""
    from pagedkv.engine.llm_engine import LLMEngine
    from pagedkv.engine.sampling_params import SamplingParams

    engine = LLMEngine(**json.loads(args.engine_kwargs))
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    result: List[float] = []

    def run() -> None:
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(str(i), p, params)
        tokens = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens += len(out.outputs[0].token_ids)
        result.append(tokens / (time.perf_counter() - start))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return result[0]


# Boolean engine flags that have a --no- form (toggles); the others are plain switches.
TOGGLES = {f.dest: f.kind == "toggle" for f in ENGINE_FLAGS}


def launch(args: argparse.Namespace) -> subprocess.Popen:
    kw = json.loads(args.engine_kwargs)
    cmd = [
        sys.executable,
        "-m",
        "pagedkv",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--uvicorn-log-level",
        "warning",
        "--disable-log-requests",
    ]
    for k, v in kw.items():
        flag = k.replace("_", "-")
        if isinstance(v, bool):  # on/off flags, never "--x False": --x, --no-x for a toggle
            if v or TOGGLES.get(k, False):
                cmd.append(f"--{flag}" if v else f"--no-{flag}")
        else:
            cmd += [f"--{flag}", str(v)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    args.url = f"http://127.0.0.1:{args.port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(args.url + "/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not become healthy")


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--launch", action="store_true", help="start `pagedkv serve` here first")
    p.add_argument("--port", type=int, default=8765, help="port for --launch")
    p.add_argument(
        "--engine-kwargs",
        default='{"max_model_len": 512, "kv_cache_space": 0.25}',
        help="JSON engine arguments for --launch and --compare-offline",
    )
    p.add_argument("--model", default=None, help="model name sent in requests")
    p.add_argument("--api-key", default=os.environ.get("PAGEDKV_API_KEY"), help="bearer key")
    p.add_argument("--num-prompts", type=int, default=32, help="requests to send")
    p.add_argument("--input-len", type=int, default=64, help="words per random prompt")
    p.add_argument("--output-len", type=int, default=32, help="tokens per completion")
    p.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        help="Poisson arrival rate in requests/s (inf: all at once)",
    )
    p.add_argument("--max-concurrency", type=int, default=None, help="cap on in-flight requests")
    p.add_argument("--seed", type=int, default=0, help="random seed")
    p.add_argument(
        "--disconnect-check",
        action="store_true",
        help="64 streaming clients, some hanging up; check nothing leaks",
    )
    p.add_argument(
        "--compare-offline",
        action="store_true",
        help="also time LLMEngine in-process on the same prompts",
    )
    args = p.parse_args()
    prompts = make_prompts(args.num_prompts, args.input_len, args.seed)
    # The peer runs first, while no server shares the CPU with it.
    peer = offline(args, prompts) if args.compare_offline and not args.disconnect_check else None
    proc = launch(args) if args.launch else None
    try:
        if args.disconnect_check:
            print(f"## disconnect check against {args.url}")
            return 0 if asyncio.run(run_disconnect(args)) else 1
        print(
            f"## serving load: {args.num_prompts} prompts x ~{args.input_len} words -> "
            f"{args.output_len} tokens, rate {args.request_rate}/s, "
            f"max concurrency {args.max_concurrency or 'unbounded'}"
        )
        results, elapsed = asyncio.run(run_load(args, prompts))
        stats = report(results, elapsed)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    if peer is not None:
        tput = peer
        served = stats["output throughput (tok/s)"]
        print("\n| path | output tok/s | ratio |\n|---|---|---|")
        print(f"| pagedkv serve (HTTP, streaming) | {served:.1f} | {served / tput:.2f} |")
        print(f"| LLMEngine in-process (peer) | {tput:.1f} | 1.00 |")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
