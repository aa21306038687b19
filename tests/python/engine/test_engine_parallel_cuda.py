"""Tensor / pipeline parallel engines on 2 GPUs (NCCL) against one GPU: the CPU tests' checks
with the CUDA-only paths on: CUDA graphs capturing the all-reduces (TP) or reading the
previous stage's hidden states (PP), the memory profile on every rank, an fp8 KV cache."""

from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest
from support.deps import need

torch = need("torch")

if torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 512
ENGINE = dict(
    device="cuda",
    dtype="float32",
    skip_tokenizer_init=True,
    max_model_len=256,
    gpu_memory_utilization=0.3,
    max_num_seqs=16,
)


@pytest.fixture(scope="module")
def model(tmp_path_factory: Any) -> str:
    return save_random_model(
        str(tmp_path_factory.mktemp("pcuda") / "m"),
        "tiny-llama",
        seed=9,
        tokenizer=False,
        vocab_size=VOCAB,
        hidden_size=256,
        head_dim=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        num_hidden_layers=4,
    )


def _generate(path: str, **kw: Any) -> tuple[list, int]:
    llm = LLM(path, **ENGINE, **kw)
    g = torch.Generator().manual_seed(1)
    prompts = [
        {"prompt_token_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()}
        for n in (5, 40, 17, 90, 3, 64)
    ]
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=1, ignore_eos=True)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        replays = _graph_replays(llm.llm_engine.runner)
    finally:
        # Nothing else may hold the engine here: memory freed after empty_cache() stays in
        # torch's cache, which the torchrun ranks' memory profile counts as used (rank 0 then
        # found no room for its KV cache on 2 H200s).
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    return [o.outputs[0] for o in outs], replays


def _graph_replays(runner: Any) -> int:
    replays = runner.graphs.num_replays if runner.graphs is not None else 0
    if hasattr(runner, "min_graph_replays"):  # every rank replayed the driver's graphs
        assert runner.min_graph_replays() == replays
    return int(replays)


# micro: pipeline_micro_batch_tokens (8: the prefill steps run as 2 micro-batches, the
# stages overlapping; a decode-only micro-batch may replay a CUDA graph). overlap:
# async_scheduling (the previous step's tokens reach the workers by a device broadcast).
# all_reduce: tp_all_reduce ("one_shot": symmetric memory, captured in the decode graphs).
@pytest.mark.parametrize(
    "tp,pp,kv,micro,overlap,all_reduce",
    [
        (2, 1, "auto", 256, False, "nccl"),
        (1, 2, "auto", 256, False, "nccl"),
        (1, 2, "auto", 8, False, "nccl"),
        (2, 1, "fp8", 256, False, "nccl"),
        (2, 1, "auto", 256, True, "nccl"),
        (2, 1, "auto", 256, True, "one_shot"),
    ],
)
def test_two_gpus_match_one(
    model: str, tp: int, pp: int, kv: str, micro: int, overlap: bool, all_reduce: str
) -> None:
    want, _ = _generate(model, kv_cache_dtype=kv)
    got, replays = _generate(
        model,
        kv_cache_dtype=kv,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        pipeline_micro_batch_tokens=micro,
        async_scheduling=overlap,
        tp_all_reduce=all_reduce,
    )
    assert replays > 0  # the decode steps ran as CUDA graphs
    same = sum(a.token_ids == b.token_ids for a, b in zip(want, got))
    assert same == len(want), f"{same}/{len(want)} sequences identical"
    worst = max(
        abs(a.logprobs[i][t].logprob - b.logprobs[i][t].logprob)
        for a, b in zip(want, got)
        for i, t in enumerate(a.token_ids)
    )
    # fp8: the ranks' k/v differ from one GPU's in the last float32 bits (the all-reduce sums
    # in another order), which may flip an fp8 rounding.
    assert worst < (1e-2 if kv == "fp8" else 1e-3), worst


_TORCHRUN_SCRIPT = """
import json, sys
from pagedkv import LLM, SamplingParams
llm = LLM(sys.argv[1], device="cuda", dtype="float32", skip_tokenizer_init=True,
          max_model_len=256, gpu_memory_utilization=0.3, tensor_parallel_size=2)
out = llm.generate([{"prompt_token_ids": [3, 1, 4, 1, 5, 9, 2, 6]}] * 3,
                   SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                   use_tqdm=False)
print("TOKENS" + json.dumps([o.outputs[0].token_ids for o in out]), flush=True)
"""


def test_torchrun_two_gpus_match_one(model: str, tmp_path: Any) -> None:
    """torchrun's ranks (NCCL between the GPUs): the driver's commands travel as one
    flat-buffer broadcast over gloo (command_channel.BroadcastChannel), not through shared
    memory."""
    script = tmp_path / "run.py"
    script.write_text(_TORCHRUN_SCRIPT)
    gc.collect()  # (what this process caches on GPU 0 counts as used in rank 0's profile)
    torch.cuda.empty_cache()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
            model,
        ],
        capture_output=True,
        text=True,
        timeout=150,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )
    # (The rank that failed first is named near the end, its traceback wherever it fell.)
    errors = [ln for ln in done.stderr.splitlines() if "[rank0]" in ln or "Error" in ln]
    assert done.returncode == 0, "\n".join(errors[-40:]) + "\n" + done.stderr[-1500:]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("TOKENS")]
    assert len(lines) == 1, done.stdout
    llm = LLM(model, **ENGINE)
    try:
        want = llm.generate(
            [{"prompt_token_ids": [3, 1, 4, 1, 5, 9, 2, 6]}] * 3,
            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
            use_tqdm=False,
        )
    finally:
        del llm
        gc.collect()
    assert json.loads(lines[0][len("TOKENS") :]) == [o.outputs[0].token_ids for o in want]
