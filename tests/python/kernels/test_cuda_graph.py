"""Decode captured in a CUDA graph and replayed after the inputs change in place: the kernels
must not synchronise, allocate or bake data-dependent launch shapes into the graph."""

from __future__ import annotations

import math
import random

import pytest
from support.deps import need

torch = need("torch")

import pagedkv  # noqa: E402
from support.cuda_cases import TOL, attention_ref, gather, make_paged_kv, rel_err  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("partition_size", [0, 128])
@pytest.mark.parametrize("layout", ["vllm", "nhd"])
def test_decode_graph_replay(layout, partition_size, kernel="auto"):
    """`kernel`: the decode kernel the calls must run on (other test files pass theirs)."""
    r = random.Random()
    gen = torch.Generator().manual_seed(r.randrange(1 << 30))
    num_seqs, hkv, group, d, bs, max_len = 4, 2, 4, 128, 16, 600
    dtype = torch.bfloat16
    kv = make_paged_kv(gen, [max_len] * num_seqs, hkv, d, bs, dtype, layout)
    q = torch.empty(num_seqs, hkv * group, d, dtype=dtype, device="cuda")
    seq_lens = torch.empty(num_seqs, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    parts = math.ceil(max_len / partition_size) if partition_size else 1
    es = torch.empty(num_seqs, hkv * group, parts, device="cuda")
    ml, tmp = torch.empty_like(es), torch.empty(num_seqs, hkv * group, parts, d, device="cuda")
    ops = pagedkv.ops
    stream = torch.cuda.Stream()

    def step() -> None:
        args = (
            q,
            kv.key_cache,
            kv.value_cache,
            hkv,
            d**-0.5,
            kv.block_tables,
            seq_lens,
            bs,
            max_len,
        )
        if partition_size:
            ops.paged_attention_v2(
                out, es, ml, tmp, *args, partition_size=partition_size, kernel=kernel
            )
        else:
            ops.paged_attention_v1(out, *args, kernel=kernel)

    q.copy_(torch.randn(q.shape, generator=gen).to(dtype))
    seq_lens.fill_(max_len)
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    for _ in range(3):
        lens = [r.randint(1, max_len) for _ in range(num_seqs)]
        q.copy_(torch.randn(q.shape, generator=gen).to(dtype))
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        kv.block_tables.copy_(kv.block_tables[torch.randperm(num_seqs, generator=gen).cuda()])
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = torch.cat(
            [
                attention_ref(q[i : i + 1].cpu(), *gather(kv, i, n), torch.tensor([n - 1]), d**-0.5)
                for i, n in enumerate(lens)
            ]
        )
        assert rel_err(out, ref) < TOL[dtype]
