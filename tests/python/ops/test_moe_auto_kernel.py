"""fused_experts(kernel="auto"): where torch._grouped_mm applies, the core's kernel for
many-expert layers with few rows per expert (Qwen3-MoE-shaped decode), grouped_mm elsewhere
(models/moe.py's measured rule), decided from the shapes alone."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.models import moe  # noqa: E402


@pytest.mark.parametrize(
    "tokens, top_k, experts, kernel",
    [
        (1, 8, 128, "pagedkv"),  # Qwen3-30B-A3B decode, measured faster on the core
        (4, 8, 128, "pagedkv"),  # a quarter row per expert: the rule's last core shape
        (5, 8, 128, "grouped_mm"),
        (16, 8, 128, "grouped_mm"),  # one row per expert: measured faster on grouped_mm
        (256, 8, 128, "grouped_mm"),  # measured faster on grouped_mm
        (1, 2, 8, "grouped_mm"),  # Mixtral-8x7B decode, measured faster on grouped_mm
        (2, 6, 64, "pagedkv"),  # DeepSeek-V2-Lite-shaped decode
        (16, 6, 64, "grouped_mm"),
    ],
)
def test_auto_rule(tokens: int, top_k: int, experts: int, kernel: str) -> None:
    assert moe.auto_moe_kernel(tokens, top_k, experts) == kernel


@pytest.mark.parametrize("tokens, used", [(2, "pagedkv"), (200, "grouped_mm")])
def test_auto_dispatches_by_the_rule(monkeypatch, tokens: int, used: str) -> None:
    """With grouped_mm applicable (patched in: a CPU run), "auto" runs the rule's kernel: 2
    tokens x top-2 over 64 experts is the core's, 200 tokens grouped_mm's; both give the same
    result as the core's kernel named."""
    calls = []
    real = moe._experts_grouped_mm

    def grouped(*args):
        calls.append("grouped_mm")
        return real(*args)

    monkeypatch.setattr(moe, "_grouped_mm_applies", lambda *a: True)
    monkeypatch.setattr(moe, "_experts_grouped_mm", grouped)
    g = torch.Generator().manual_seed(1)
    e, h, inter, k = 64, 16, 8, 2
    x = torch.randn(tokens, h, generator=g)
    w13 = torch.randn(e, 2 * inter, h, generator=g)
    w2 = torch.randn(e, h, inter, generator=g)
    weights = torch.rand(tokens, k, generator=g)
    ids = torch.randint(0, e, (tokens, k), generator=g, dtype=torch.int32)
    if used == "grouped_mm" and not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    out = moe.fused_experts(x, w13, w2, weights, ids, kernel="auto")
    assert calls == ([] if used == "pagedkv" else ["grouped_mm"])
    want = moe.fused_experts(x, w13, w2, weights, ids, kernel="pagedkv")
    assert torch.allclose(out, want, atol=1e-4, rtol=1e-4)
