"""Sampling on the GPU: the top_k_top_p_threshold kernel equals the CPU kernel bit for bit
(fixed-point masses) on vocabulary-sized rows, and the batched Sampler on CUDA draws from the
exact truncated distribution, greedy is argmax, seeded rows ignore their batch-mates."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.deps import need

torch = need("torch")

from pagedkv import ops  # noqa: E402
from pagedkv.engine.sampler import Sampler, SamplingRow  # noqa: E402
from pagedkv.engine.sampling_params import SamplingParams  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("vocab", [1000, 32000, 128256])
def test_threshold_kernel_is_the_cpu_kernel(vocab):
    r = random.Random()
    seed = r.randrange(1 << 30)
    g = torch.Generator().manual_seed(seed)
    rows = 48
    logits = (
        torch.randn(rows, vocab, generator=g)
        * torch.tensor([r.choice([0.5, 2.0, 8.0]) for _ in range(rows)])[:, None]
    )
    logits[::3] = logits[::3].round()  # ties
    probs = logits.softmax(-1)
    probs[1::4, : vocab // 3] = 0.0
    top_k = torch.tensor(
        [r.choice([0, 1, 7, 50, vocab - 1, vocab]) for _ in range(rows)], dtype=torch.int32
    )
    top_p = torch.tensor([r.choice([1.0, 0.95, 0.5, 1e-6]) for _ in range(rows)])
    min_p = torch.tensor([r.choice([0.0, 0.0, 0.1]) for _ in range(rows)])
    cpu = torch.empty(rows)
    ops.top_k_top_p_threshold(cpu, probs, top_k, top_p, min_p)
    gpu = torch.empty(rows, device="cuda")
    ops.top_k_top_p_threshold(gpu, probs.cuda(), top_k.cuda(), top_p.cuda(), min_p.cuda())
    assert torch.equal(gpu.cpu(), cpu), seed


def _row(params: SamplingParams, gen=None) -> SamplingRow:
    return SamplingRow(params, [], [], gen, ())


@pytest.mark.parametrize(
    "t,k,p,min_p", [(0.8, 0, 1.0, 0.0), (1.0, 4, 0.9, 0.0), (1.2, 0, 0.6, 0.1)]
)
def test_cuda_sampler_matches_the_cpu_distribution(t, k, p, min_p):
    logits = torch.randn(1, 16, generator=torch.Generator().manual_seed(5)) * 1.5
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=min_p)
    n = 40000
    freqs = []
    for dev in ("cpu", "cuda"):
        rows = [_row(params) for _ in range(n)]
        toks = Sampler(torch.device(dev), seed=1)(
            logits.to(dev).expand(n, -1).contiguous(), rows
        ).token_ids
        freqs.append(np.bincount(toks, minlength=16) / n)
    assert np.all((freqs[0] == 0) == (freqs[1] == 0))  # the same tokens truncated
    assert np.abs(freqs[0] - freqs[1]).max() < 0.02


def test_cuda_greedy_and_seeded_rows():
    sampler = Sampler(torch.device("cuda"))
    logits = torch.randn(6, 5000, device="cuda")
    greedy = sampler(logits, [_row(SamplingParams(temperature=0)) for _ in range(6)])
    assert greedy.token_ids == logits.argmax(-1).tolist()

    def seeded(extra: int) -> list[int]:
        g = sampler.make_generator(77)
        out = []
        for step in range(4):
            batch = torch.cat([torch.randn(extra, 5000, device="cuda"), logits[:1] + step])
            rows = [_row(SamplingParams(temperature=1.0, top_p=0.9)) for _ in range(extra)]
            rows.append(_row(SamplingParams(temperature=1.0, top_p=0.9, seed=77), gen=g))
            out.append(sampler(batch, rows).token_ids[-1])
        return out

    assert seeded(0) == seeded(9)


def test_race_kernel_agrees_with_the_cpu_kernel():
    g = torch.Generator().manual_seed(9)
    probs = torch.softmax(torch.randn(200, 32000, generator=g) * 2, -1)
    thresholds = torch.where(torch.arange(200) % 2 == 0, 0.0, 1e-5).float()
    keys = torch.randint(0, 1 << 62, (200,), generator=g)
    cpu, gpu = (
        torch.empty(200, dtype=torch.int64),
        torch.empty(200, dtype=torch.int64, device="cuda"),
    )
    ops.sample_exponential_race(cpu, probs, thresholds, keys)
    ops.sample_exponential_race(gpu, probs.cuda(), thresholds.cuda(), keys.cuda())
    # The same noise and scores; only a 1-ulp difference of log1pf between the CPU and CUDA
    # math libraries could split a near-tie.
    assert (gpu.cpu() == cpu).float().mean() >= 0.99
