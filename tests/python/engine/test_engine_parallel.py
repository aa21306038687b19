"""Tensor and pipeline parallel engines on CPU processes (gloo) against the one-process engine.

One workload per layout, on tiny random Llama (2 KV heads), Qwen2 (1 KV head: replicated
under TP=2; tied embeddings split over stages under PP) and Mixtral (experts split along their
intermediate dimension): prompts sharing a prefix (prefix-cache
hits) and more KV than the cache holds (preemption, by recompute or swap); under PP, steps cut
into micro-batches (stages overlapping) and steps run whole. Greedy tokens must be
those of TP=1 and logprobs within 1e-4; no request or block may leak and no worker process may
outlive the engine. A worker killed mid-run ends the engine with an error naming it.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.distributed import model_parallel_is_initialized  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

# Each rank is a process: more threads than cores would only contend.
pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 300
SHAPES = {  # head_dim 32: the smallest the paged kernels take
    "tiny-llama": dict(hidden_size=64, head_dim=32, num_hidden_layers=3),
    "tiny-qwen2": dict(hidden_size=128, num_hidden_layers=3),
    "tiny-mixtral": dict(hidden_size=64, head_dim=32, num_hidden_layers=3),
}
ENGINE = dict(
    device="cpu",
    skip_tokenizer_init=True,
    max_model_len=128,
    block_size=16,
    num_gpu_blocks_override=14,
    num_cpu_blocks=64,
    max_num_seqs=8,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("parallel")
    return {
        name: save_random_model(
            str(root / name), name, seed=5, tokenizer=False, vocab_size=VOCAB, **shape
        )
        for name, shape in SHAPES.items()
    }


def _workload() -> tuple[list[dict], SamplingParams]:
    g = torch.Generator().manual_seed(11)
    prefix = torch.randint(0, VOCAB, (40,), generator=g).tolist()  # 2.5 blocks shared
    prompts = [
        {"prompt_token_ids": prefix + torch.randint(0, VOCAB, (n,), generator=g).tolist()}
        for n in (3, 9, 1, 17, 6, 12)
    ]
    # 6 x (~49 + 40) tokens against 14 blocks of 16: the batch cannot all stay resident.
    return prompts, SamplingParams(temperature=0, max_tokens=40, logprobs=2, ignore_eos=True)


def _run(path: str, **kw: Any) -> tuple[list, dict, list]:
    llm = LLM(path, **ENGINE, **kw)
    try:
        prompts, params = _workload()
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert_no_leak(llm)
        stats = llm.llm_engine.get_stats()
        runner = llm.llm_engine.runner
        procs = list(runner._state.procs) if hasattr(runner, "_state") else []
        if hasattr(runner, "worker"):
            stats["micro_batched_steps"] = runner.worker.micro_batched_steps
            assert runner.min_graph_replays() == 0  # (the CPU runs no CUDA graphs)
    finally:
        del llm
        gc.collect()
    return [o.outputs[0] for o in outs], stats, procs


_REFERENCE: dict[tuple[str, str, str], list] = {}


# micro: pipeline_micro_batch_tokens (256, the default, never cuts these small steps; 8 cuts
# every step with 16+ prefill tokens into one micro-batch per stage). overlap: async_scheduling
# (the workers' input ids then hold placeholders, filled from the driver's device broadcast of
# the previous step's tokens); the reference is always the serial one-rank engine.
@pytest.mark.parametrize(
    "preset,tp,pp,mode,kv,micro,overlap",
    [
        ("tiny-llama", 2, 1, "recompute", "auto", 256, False),
        ("tiny-qwen2", 2, 1, "swap", "auto", 256, False),
        ("tiny-qwen2", 1, 2, "recompute", "auto", 256, False),
        ("tiny-llama", 1, 2, "swap", "auto", 8, False),
        ("tiny-llama", 2, 2, "swap", "auto", 256, False),
        ("tiny-qwen2", 2, 1, "recompute", "fp8", 256, False),
        ("tiny-mixtral", 2, 2, "recompute", "auto", 8, False),
        ("tiny-llama", 2, 1, "recompute", "auto", 256, True),
        ("tiny-llama", 2, 2, "swap", "auto", 8, True),
    ],
)
def test_parallel_engine_matches_one_rank(
    models: dict[str, str],
    preset: str,
    tp: int,
    pp: int,
    mode: str,
    kv: str,
    micro: int,
    overlap: bool,
) -> None:
    key = (preset, mode, kv)
    if key not in _REFERENCE:
        _REFERENCE[key] = _run(models[preset], preemption_mode=mode, kv_cache_dtype=kv)[0]
    expected = _REFERENCE[key]
    got, stats, procs = _run(
        models[preset],
        preemption_mode=mode,
        kv_cache_dtype=kv,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        pipeline_micro_batch_tokens=micro,
        async_scheduling=overlap,
    )
    assert (stats["micro_batched_steps"] > 0) == (micro < 256 and pp > 1), stats
    # fp8 caches: the ranks' k/v differ from one rank's in the last float32 bits (the
    # all-reduce sums in another order), which may flip an fp8 rounding.
    tol = 1e-2 if kv == "fp8" else 1e-4
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0, stats
    assert len(procs) == tp * pp - 1
    for want, have in zip(expected, got):
        assert have.token_ids == want.token_ids
        for lp_want, lp_have in zip(want.logprobs, have.logprobs):
            assert lp_have.keys() == lp_want.keys()
            for tok in lp_want:
                assert abs(lp_have[tok].logprob - lp_want[tok].logprob) < tol
    _assert_gone(procs)
    assert not model_parallel_is_initialized()


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_step_sends_one_command(models: dict[str, str], overlap: bool) -> None:
    """A plain decode step reaches the workers as one command (execute; they go on to their
    share of the logits unasked), and the tokens are still those of one rank. The second
    request ends early on a stop token: overlapped, the step planned before that token was
    seen still holds its row, which is not sampled, so the driver asks for other rows than
    the workers computed (the unasked collective is matched, then a compute_logits command)."""
    prompts = [{"prompt_token_ids": [5, 7, 11, 13]}, {"prompt_token_ids": [2, 3]}]
    one = LLM(models["tiny-llama"], **ENGINE)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    free = one.generate(prompts[1:], greedy, use_tqdm=False)[0].outputs[0].token_ids
    stop = next(t for i, t in enumerate(free) if i >= 5 and t not in free[:i])
    params = [greedy, SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop])]
    want = one.generate(prompts, params, use_tqdm=False)
    del one
    assert len(want[1].outputs[0].token_ids) < 24
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2, async_scheduling=overlap)
    try:
        channel = llm.llm_engine.runner._state.channel
        sent: list[str] = []
        send = channel.send
        channel.send = lambda name, args: (sent.append(name), send(name, args))[1]
        got = llm.generate(prompts, params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
        # 1 prefill step (execute + compute_logits of its last rows) and 23 decode steps;
        # overlapped, one decode step asks for the rows of the live request alone.
        assert sent.count("execute") == 24, sent
        assert sent.count("compute_logits") == (2 if overlap else 1), sent
    finally:
        del llm
        gc.collect()


def test_one_shot_all_reduce_refused_on_the_cpu(models: dict[str, str]) -> None:
    """The symmetric-memory all-reduce exists on CUDA only: refused by name, no rank started."""
    with pytest.raises(ValueError, match="tp_all_reduce='one_shot'.*needs CUDA devices"):
        LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2, tp_all_reduce="one_shot")
    assert not model_parallel_is_initialized()
    with pytest.raises(ValueError, match="tp_all_reduce must be one of nccl, one_shot"):
        LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2, tp_all_reduce="two_shot")


def test_image_model_refused_under_tp(tmp_path: Any) -> None:
    """A vision-language model's image rows do not travel to the workers: refused by name at
    start-up (not a failure at the first image), and no rank is left behind."""
    from pagedkv.testing import save_random_llava

    path = save_random_llava(str(tmp_path / "llava"))
    with pytest.raises(ValueError, match="image inputs.*does not support tensor or pipeline"):
        LLM(path, device="cpu", max_model_len=256, tensor_parallel_size=2)
    assert not model_parallel_is_initialized()


def test_killed_worker_ends_the_engine(models: dict[str, str]) -> None:
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    procs = list(llm.llm_engine.runner._state.procs)
    victim = procs[0].pid
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"worker rank 1 \(pid {victim}\) exited"):
        for _ in range(1000):  # long enough to be running when the worker dies
            llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 4, params, use_tqdm=False)
    assert time.monotonic() - t0 < 30
    with pytest.raises(RuntimeError, match="the parallel engine is down"):
        llm.generate([{"prompt_token_ids": [1, 2, 3]}], params, use_tqdm=False)
    _assert_gone(procs)
    assert not model_parallel_is_initialized()
    del llm
    gc.collect()


def _assert_gone(procs: list) -> None:
    deadline = time.monotonic() + 15
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.is_alive() for p in procs), "a worker process outlived its engine"


_TORCHRUN_SCRIPT = """
import json, os, sys
import torch
from pagedkv import LLM, SamplingParams
torch.set_num_threads(1)
llm = LLM(sys.argv[1], device="cpu", skip_tokenizer_init=True, max_model_len=128,
          kv_cache_space=0.01, tensor_parallel_size=2)
out = llm.generate([{"prompt_token_ids": [3, 1, 4, 1, 5, 9]}],
                   SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
print("TOKENS" + json.dumps(out[0].outputs[0].token_ids), flush=True)
"""


def test_torchrun_launches_the_ranks(models: dict[str, str], tmp_path: Any) -> None:
    """The multi-node form: torchrun starts every rank (env:// rendezvous); rank 0 drives and
    the others serve it from inside LLM(), then exit 0 when rank 0 is done."""
    script = tmp_path / "run.py"
    script.write_text(_TORCHRUN_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(script),
            models["tiny-llama"],
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("TOKENS")]
    assert len(lines) == 1, done.stdout  # rank 0 only: the other rank never returns from LLM()
    llm = LLM(
        models["tiny-llama"],
        device="cpu",
        skip_tokenizer_init=True,
        max_model_len=128,
        kv_cache_space=0.01,
    )
    want = llm.generate(
        [{"prompt_token_ids": [3, 1, 4, 1, 5, 9]}],
        SamplingParams(temperature=0, max_tokens=8),
        use_tqdm=False,
    )
    assert json.loads(lines[0][len("TOKENS") :]) == want[0].outputs[0].token_ids


_CTRL_C_SCRIPT = """
import faulthandler, signal, sys
import torch
from pagedkv import LLM, SamplingParams


def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a background job ignores it)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # (the test's view of a hang)
    torch.set_num_threads(1)
    llm = LLM(sys.argv[1], device="cpu", skip_tokenizer_init=True, max_model_len=128,
              kv_cache_space=0.01, tensor_parallel_size=2)
    print("PIDS", *[p.pid for p in llm.llm_engine.runner._state.procs], flush=True)
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    try:
        while True:
            llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 4, params, use_tqdm=False)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)


if __name__ == "__main__":  # spawned workers import this file: they must not run it
    main()
"""


def test_ctrl_c_ends_the_workers(models: dict[str, str], tmp_path: Any) -> None:
    """Ctrl-C in the middle of a step: the driver gets its KeyboardInterrupt, the workers (which
    ignore SIGINT) are stopped, and the program exits with none left behind."""
    script = tmp_path / "ctrl_c.py"
    script.write_text(_CTRL_C_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, str(script), models["tiny-llama"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        workers = [int(p) for p in line.split()[1:]]
        time.sleep(1.0)  # generating now
        for _ in range(3):
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole group
            try:
                out, err = proc.communicate(timeout=15)
                break
            except subprocess.TimeoutExpired:
                # Python drops a KeyboardInterrupt that lands inside a finaliser (a torch or
                # numpy __del__ run mid-step: "Exception ignored in"); a user presses again.
                continue
        else:
            os.kill(proc.pid, signal.SIGUSR1)  # its threads' stacks, to stderr
            time.sleep(1.0)
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the driver did not end after three Ctrl-C:\n{err[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "INTERRUPTED" in out and proc.returncode == 0, (proc.returncode, err[-3000:])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_pid_alive(p) for p in workers):
        time.sleep(0.1)
    assert not any(_pid_alive(p) for p in workers), "a worker outlived Ctrl-C"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


_KILLED_DRIVER_SCRIPT = """
import sys, time
import torch
from pagedkv import LLM


def main():
    torch.set_num_threads(1)
    llm = LLM(sys.argv[1], device="cpu", skip_tokenizer_init=True, max_model_len=128,
              kv_cache_space=0.01, tensor_parallel_size=2)
    ring = llm.llm_engine.runner._state.channel.ring.shm.name
    print("PIDS", ring, *[p.pid for p in llm.llm_engine.runner._state.procs], flush=True)
    time.sleep(60)  # idle: the workers wait for a command


if __name__ == "__main__":
    main()
"""


def test_killed_driver_ends_the_workers(models: dict[str, str], tmp_path: Any) -> None:
    """The driver dies without a word (SIGKILL) while its workers wait on the command ring:
    they notice within their liveness check and exit, and the ring's shared memory goes."""
    script = tmp_path / "driver.py"
    script.write_text(_KILLED_DRIVER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, str(script), models["tiny-llama"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("PIDS"), line
        ring, *pids = line.split()[1:]
        workers = [int(p) for p in pids]
        proc.kill()
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        any(_pid_alive(p) for p in workers) or os.path.exists(f"/dev/shm/{ring}")
    ):
        time.sleep(0.1)
    assert not any(_pid_alive(p) for p in workers), "a worker outlived its killed driver"
    assert not os.path.exists(f"/dev/shm/{ring}"), "the command ring outlived the engine"


def _kill_mid_generate(llm: Any) -> tuple[int, str]:
    """Kills worker rank 1 while ``llm`` generates; (its pid, the engine's error)."""
    victim = llm.llm_engine.runner._state.procs[0].pid
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    params = SamplingParams(temperature=0, max_tokens=120, ignore_eos=True)
    with pytest.raises(RuntimeError) as err:
        for _ in range(1000):
            llm.generate([{"prompt_token_ids": [1, 2, 3]}] * 4, params, use_tqdm=False)
    return victim, str(err.value)


def test_killed_worker_is_named_when_the_monitor_is_late(
    models: dict[str, str], monkeypatch: Any
) -> None:
    """On a loaded machine the monitor thread may wake well after the driver's collective
    failed: the driver must still name the dead worker (it gave a generic 'left the ranks out
    of step' when the monitor took more than 0.2 s)."""
    from pagedkv.engine import executor_mp

    real = executor_mp._monitor

    def late_monitor(state: Any) -> None:
        import multiprocessing.connection

        multiprocessing.connection.wait([p.sentinel for p in state.procs])
        time.sleep(1.5)  # descheduled
        real(state)

    monkeypatch.setattr(executor_mp, "_monitor", late_monitor)
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    procs = list(llm.llm_engine.runner._state.procs)
    victim, error = _kill_mid_generate(llm)
    assert f"worker rank 1 (pid {victim}) exited" in error, error
    _assert_gone(procs)
    del llm
    gc.collect()


def test_monitor_aborts_before_the_driver_destroys_the_groups(
    models: dict[str, str], monkeypatch: Any
) -> None:
    """A worker dies: the monitor aborts the communicators (on NCCL that is what ends the
    driver's collective), the driver's thread then tears the groups down, and must wait for
    the monitor's abort to finish: destroying NCCL groups under it is a use-after-free. A
    slow abort, and a driver that reaches its teardown while it runs, show the order."""
    from pagedkv.engine import executor_mp

    seen: list[bool] = []

    def slow_abort() -> None:
        time.sleep(1.5)
        seen.append(model_parallel_is_initialized() and torch.distributed.is_initialized())

    real_shutdown = executor_mp._shutdown

    def late_shutdown(state: Any) -> None:
        time.sleep(0.5)  # the monitor is in its abort now
        real_shutdown(state)

    monkeypatch.setattr(executor_mp, "abort_communicators", slow_abort)
    monkeypatch.setattr(executor_mp, "_shutdown", late_shutdown)
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    _, error = _kill_mid_generate(llm)
    assert "worker rank 1" in error, error
    for t in threading.enumerate():
        if t.name == "pagedkv-worker-monitor":
            t.join(5)
    assert seen == [True], "the driver destroyed the groups under the monitor's abort"
    assert not model_parallel_is_initialized()
    del llm
    gc.collect()


def test_shutdown_waits_for_a_command_in_another_thread(
    models: dict[str, str], monkeypatch: Any
) -> None:
    """shutdown() from one thread while another runs a command (the server's engine thread
    still in a step at exit): the teardown must not destroy the groups (or close the command
    ring) under that command; one that does not end in time is ended by stopping the workers,
    and fails with an error, never with the groups gone from under it."""
    from pagedkv.engine import executor_mp

    monkeypatch.setattr(executor_mp, "_JOIN_TIMEOUT_S", 1.0)
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    runner = llm.llm_engine.runner
    procs = list(runner._state.procs)
    real = runner.worker.min_graph_replays
    in_command = threading.Event()
    groups_there: list[bool] = []
    result: list[Any] = []

    def slow_min_graph_replays() -> int:
        in_command.set()
        time.sleep(2.5)  # longer than shutdown()'s waits (1 s each)
        groups_there.append(model_parallel_is_initialized())
        return real()

    def command() -> None:
        try:
            result.append(runner.min_graph_replays())
        except RuntimeError as exc:
            result.append(str(exc))

    runner.worker.min_graph_replays = slow_min_graph_replays
    thread = threading.Thread(target=command)
    thread.start()
    assert in_command.wait(10)
    runner.shutdown()
    thread.join(10)
    assert groups_there == [True], "the groups were torn down under a running command"
    assert len(result) == 1 and "parallel engine is down" in str(result[0]), result
    assert not model_parallel_is_initialized()
    _assert_gone(procs)
    del llm
    gc.collect()


def test_commands_go_by_broadcast_where_the_ring_is_unordered(
    models: dict[str, str], monkeypatch: Any
) -> None:
    """The shared-memory ring relies on x86's store order; elsewhere (aarch64) the spawned
    workers get their commands by a gloo broadcast, with the same tokens."""
    from pagedkv.distributed.shm_ring import ShmRing
    from pagedkv.engine.command_channel import BroadcastChannel

    monkeypatch.setattr(ShmRing, "ordered", staticmethod(lambda: False))
    prompts = [{"prompt_token_ids": [3, 1, 4, 1, 5, 9]}, {"prompt_token_ids": [2, 7]}]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    procs = list(llm.llm_engine.runner._state.procs)
    try:
        assert isinstance(llm.llm_engine.runner._state.channel, BroadcastChannel)
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        del llm
        gc.collect()
    _assert_gone(procs)
    one = LLM(models["tiny-llama"], **ENGINE)
    want = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    assert got == want


def test_calls_after_shutdown_are_refused_by_name(models: dict[str, str]) -> None:
    """After shutdown() a command is refused as such (it failed on the closed command ring
    before), and a failed step's clean-up (finish_swap_out) has nothing left to save."""
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    runner = llm.llm_engine.runner
    procs = list(runner._state.procs)
    runner.shutdown()
    _assert_gone(procs)
    runner.finish_swap_out(None)
    with pytest.raises(RuntimeError, match="the parallel engine is down: shut down"):
        runner.min_graph_replays()
    del llm
    gc.collect()


def test_driver_exception_mid_command_ends_the_workers(models: dict[str, str]) -> None:
    """The driver's own side of a command raises while the workers wait in its collective:
    the engine goes down naming the error, the workers are stopped and the groups are gone
    (nothing waits for the collective's timeout)."""
    llm = LLM(models["tiny-llama"], **ENGINE, tensor_parallel_size=2)
    runner = llm.llm_engine.runner
    procs = list(runner._state.procs)

    def broken() -> int:
        raise ValueError("driver side broke")

    runner.worker.min_graph_replays = broken
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ValueError during min_graph_replays\(\) left"):
        runner.min_graph_replays()
    assert time.monotonic() - t0 < 15
    _assert_gone(procs)
    assert not model_parallel_is_initialized()
    del llm
    gc.collect()
