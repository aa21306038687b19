"""The engine's cascade decode captured in a CUDA graph once and replayed over steps whose
plans and tables were refilled (rows finishing, own lengths growing, another shared prefix),
against the plain decode of the same step (engine/decode_plans.StepPlans, the graph runner's
order: static inputs refilled, fill_cascade, replay)."""

from __future__ import annotations

import numpy as np
import pytest
from support.deps import need
from support.paged_cases import shared_prefix_tables

torch = need("torch")

from pagedkv.balanced_decode import target_items  # noqa: E402
from pagedkv.cascade import CascadeDecode  # noqa: E402
from pagedkv.engine.decode_plans import StepPlans  # noqa: E402
from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend  # noqa: E402
from pagedkv.models.attention_backend import AttentionSpec  # noqa: E402

pytestmark = pytest.mark.cuda

KVH, H, D, BS, WIDTH, NBLK = 2, 8, 128, 16, 40, 200


@pytest.fixture(autouse=True)
def _hopper_decode():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the cascade runs on the Hopper decode (compute capability 9.x)")


def _meta(seq_lens, tables, n: int, max_len: int) -> AttentionMetadata:
    return AttentionMetadata(
        num_prefills=0,
        num_prefill_tokens=0,
        num_decode_tokens=n,
        slot_mapping=torch.full((n,), -1, dtype=torch.int64, device="cuda"),  # no writes
        seq_lens=seq_lens,
        query_start_loc=torch.zeros(1, dtype=torch.int32, device="cuda"),
        block_tables=tables,
        max_query_len=1,
        max_decode_seq_len=max_len,
    )


def _tables(rng, shared: int, lens: list[int]) -> np.ndarray:
    return shared_prefix_tables(rng, shared, lens, NBLK, WIDTH, BS)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cascade_graph_replays_refilled_plans(dtype):
    rng = np.random.default_rng(3)
    gen = torch.Generator(device="cuda").manual_seed(3)
    kv = torch.randn(2, NBLK, BS, KVH, D, generator=gen, device="cuda").to(dtype)
    bs = 8
    rows = torch.empty(bs, H, D, dtype=dtype, device="cuda")
    cascade = CascadeDecode(rows, kv[0], kv[1], KVH)
    target = target_items(rows[:1], kv[0], kv[1], KVH)
    plans = StepPlans(bs, H, D, target, "cuda", cascade=cascade, max_blocks=WIDTH)
    seq_lens = torch.ones(bs, dtype=torch.int32, device="cuda")
    tables = torch.zeros(bs, WIDTH, dtype=torch.int32, device="cuda")
    q = torch.zeros(bs, H, D, dtype=dtype, device="cuda")
    backend = PagedAttentionBackend([kv], H, KVH, D, BS, "auto", plans)
    backend.set_metadata(_meta(seq_lens, tables, bs, WIDTH * BS))
    spec = AttentionSpec.default(D)
    new = torch.zeros(bs, KVH, D, dtype=dtype, device="cuda")
    plans.begin_capture(bs, cascade=True)
    backend.forward(0, q, new, new, spec)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(0, q, new, new, spec)
    steps = [
        (20, [320 + x for x in (1, 5, 17, 30, 2, 9, 33, 16)]),
        (20, [320 + x for x in (2, 6, 18, 31, 3, 10)]),  # two requests finished
        (20, [320 + x for x in (7, 19, 32, 4)]),
        (30, [480 + x for x in (40, 3, 77, 21, 5)]),  # another prompt, longer
    ]
    plain = PagedAttentionBackend([kv], H, KVH, D, BS, "auto", None)
    for shared, lens in steps:
        n, t = len(lens), _tables(rng, shared, lens)
        seq_lens.fill_(1)
        seq_lens[:n] = torch.tensor(lens, dtype=torch.int32)
        tables[:n] = torch.from_numpy(t).cuda()
        step_q = torch.randn(n, H, D, generator=gen, device="cuda").to(dtype)
        q.zero_()
        q[:n] = step_q
        assert plans.fill_cascade(np.array(lens), t, bs)
        graph.replay()
        got = out[:n].float()
        plain.set_metadata(_meta(seq_lens[:n].clone(), tables[:n].clone(), n, max(lens)))
        want = plain.forward(0, step_q, new[:n], new[:n], spec).float()
        torch.cuda.synchronize()
        err = ((got - want).norm() / want.norm()).item()
        assert err < 2e-2, (shared, lens, err)
    assert plans.cascade_layers == 0  # every step above was a replay
