"""Quantized weights on the GPU: the int4 GEMM kernel against float64 over random shapes
(decode- and prefill-sized M, both tile heights), and fp8 checkpoints running through
torch._scaled_mm on fp8 tensor cores against the dequantised model."""

from __future__ import annotations

import pytest
from support.deps import need
from support.int4_reference import TOL, random_int4

torch = need("torch")

from pagedkv import ops  # noqa: E402

pytestmark = pytest.mark.cuda
SHAPES = [(1, 40, 64, 32), (16, 4096, 512, 128), (17, 130, 96, 16), (300, 512, 4096, 128),
          (64, 64, 32, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m, n, k, group", SHAPES)
def test_int4_gemm_matches_float64(m: int, n: int, k: int, group: int,
                                   dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(m + n)
    q = random_int4(n, k, group, dtype, g)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = ops.int4_gemm(x.cuda(), q["qweight"].cuda(), q["scales"].cuda(), q["zeros"].cuda(),
                        group)
    want = x.double() @ q["w"].T
    err = float((out.cpu().double() - want).abs().max())
    assert err <= TOL[dtype] * max(1.0, float(want.abs().max()))


def test_fp8_checkpoint_uses_scaled_mm(tmp_path) -> None:
    from pagedkv.models import load_model
    from pagedkv.models.quantization import QuantLinear
    from pagedkv.models.reference_backend import DenseAttentionBackend
    from pagedkv.testing import save_random_model
    from support.quantize import quantize_checkpoint

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 tensor cores need compute capability >= 8.9")
    src = save_random_model(str(tmp_path / "f"), "tiny-llama", seed=2, tokenizer=False,
                            vocab_size=512, head_dim=32, dtype=torch.bfloat16)
    quantize_checkpoint(src, str(tmp_path / "q"), str(tmp_path / "r"), "fp8", per_channel=True)
    model, _ = load_model(str(tmp_path / "q"), torch.bfloat16, "cuda")
    ref, _ = load_model(str(tmp_path / "r"), torch.bfloat16, "cuda")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.scaled_mm for m in layers)
    ids = torch.randint(0, 512, (40,), device="cuda")
    pos = torch.arange(40, device="cuda")
    a = model.compute_logits(model(ids, pos, DenseAttentionBackend())).double()
    b = ref.compute_logits(ref(ids, pos, DenseAttentionBackend())).double()
    # The activations are quantised to fp8 per token (the dequantised model keeps them bf16).
    assert float((a - b).abs().max() / b.abs().max()) < 0.1
