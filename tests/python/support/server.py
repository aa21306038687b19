"""Servers for the server tests: a real `python -m pagedkv serve` on a free loopback port
(RemoteServer, small_server), or the app in process on a tiny random model (tiny_async_engine,
in_process_app, wait_engine_idle)."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import httpx

from support.deps import need_random_tokenizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def small_server(
    tmp_path_factory: Any,
    name: str,
    *,
    model: str = "smol",
    max_model_len: int = 256,
    kv_cache_space: float = 0.05,
    max_num_seqs: int = 8,
    env: Optional[Dict[str, str]] = None,
    extra_args: Sequence[str] = (),
) -> RemoteServer:
    """The default model served on the CPU on a free local port with a small KV cache and
    quiet uvicorn, its log in a fresh temporary directory `name` (the server test modules'
    fixture); ``extra_args``: more `serve` flags. The CPU on every machine: the tests compare
    with CPU engines in the test process (on a GPU machine the server chose CUDA, and its
    embeddings missed the CPU ones by 3e-3), and --kv-cache-space sizes only a CPU cache."""
    tmp = tmp_path_factory.mktemp(name)
    return RemoteServer(
        [
            "--served-model-name",
            model,
            "--host",
            "127.0.0.1",
            "--max-model-len",
            str(max_model_len),
            "--kv-cache-space",
            str(kv_cache_space),
            "--max-num-seqs",
            str(max_num_seqs),
            "--uvicorn-log-level",
            "warning",
            "--device",
            "cpu",
            *extra_args,
        ],
        tmp / "server.log",
        env=env,
    )


def tiny_async_engine(
    tmp_path_factory: Any,
    name: str,
    *,
    seed: int,
    max_model_len: int,
    num_gpu_blocks: int = 64,
    max_num_seqs: int = 8,
    **engine_kw: Any,
) -> Any:
    """An AsyncLLMEngine on a fresh tiny random llama (CPU, float32, 8-token blocks), saved in
    a temporary directory `name`; ``engine_kw``: more engine arguments. The caller shuts it
    down."""
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine
    from pagedkv.testing import save_random_model

    need_random_tokenizer()  # (the tokenizer of the random checkpoint)
    path = save_random_model(
        str(tmp_path_factory.mktemp(name)),
        "tiny-llama",
        seed=seed,
        head_dim=32,
        max_position_embeddings=256,
    )
    return AsyncLLMEngine(
        model=path,
        device="cpu",
        dtype="float32",
        block_size=8,
        num_gpu_blocks_override=num_gpu_blocks,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        **engine_kw,
    )


def in_process_app(engine: Any, **server_args: Any) -> Any:
    """The OpenAI app over `engine`, as `serve` builds it; ``server_args``: the `serve` flags
    the app reads (limits, headers), by their argparse names."""
    from pagedkv.entrypoints.openai.api_server import build_app

    return build_app(engine, argparse.Namespace(**server_args))


def wait_engine_idle(engine: Any, timeout: float = 20.0) -> None:
    """Waits until an in-process AsyncLLMEngine holds no request and no KV block (the answer
    reaches the client before the engine has freed the request's blocks)."""
    deadline = time.monotonic() + timeout
    while engine.get_stats()["kv_cache_usage_perc"] != 0 or engine.engine.requests:
        assert time.monotonic() < deadline, ("KV blocks leaked", engine.get_stats())
        time.sleep(0.02)


class RemoteServer:
    def __init__(
        self,
        args: List[str],
        log_path: Path,
        env: Optional[Dict[str, str]] = None,
        startup_timeout: float = 240.0,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "pagedkv", "serve", *args, "--port", str(self.port)]
        self._log = open(log_path, "w")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"server not healthy after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-6000:]

    def metrics(self) -> Dict[str, float]:
        """Sample name (labels dropped) -> value, from the Prometheus text at /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        values: Dict[str, float] = {}
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)$", line)
            if m:
                values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(2))
        return values

    def metric(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels`` (0 if none)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$", line)
            if not m or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def wait_idle(self, timeout: float = 30.0) -> Dict[str, float]:
        """Polls /metrics until no request runs or waits and no KV block is in use."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (
                m["pagedkv:num_requests_running"] == 0
                and m["pagedkv:num_requests_waiting"] == 0
                and m["pagedkv:kv_cache_usage_perc"] == 0
            )
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
