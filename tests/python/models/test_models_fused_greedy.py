"""A bf16 Llama on the fused ops against the same model on the eager math they replaced (the
layers' fallback): the logits are (all but bit-)identical and the greedy tokens the same,
so switching the engine to the fused ops moves no greedy decode."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

import pagedkv.models.layers as layers  # noqa: E402
import pagedkv.models.rotary as rotary  # noqa: E402
from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import DenseAttentionBackend  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_and_eager_llama_pick_the_same_tokens(tmp_path, monkeypatch, dtype):
    path = save_random_model(
        str(tmp_path / "m"), "tiny-llama", seed=3, tokenizer=False, vocab_size=512
    )
    model, _ = load_model(path, dtype, "cpu")
    g = torch.Generator().manual_seed(4)
    lengths = [5, 33, 12]
    ids = torch.randint(0, 512, (sum(lengths),), generator=g)
    positions = torch.cat([torch.arange(n) for n in lengths])
    loc = [0]
    for n in lengths:
        loc.append(loc[-1] + n)

    def logits() -> torch.Tensor:
        return model.compute_logits(model(ids, positions, DenseAttentionBackend(loc)))

    fused = logits()
    monkeypatch.setattr(layers, "fused_ok", lambda x: False)
    monkeypatch.setattr(rotary, "_FUSED_DTYPES", ())
    eager = logits()
    scale = float(eager.abs().max())
    # The ops round as the eager formulas do: the logits are equal, but for a rare 1-ulp
    # difference of a norm's reduction order (bit-identical on this model as written).
    assert (fused == eager).float().mean() >= 0.99
    assert float((fused - eager).abs().max()) <= 0.05 * scale
    top2 = eager.topk(2, dim=-1).values
    decisive = (top2[:, 0] - top2[:, 1]) > 0.05 * scale  # not a near-tie in the eager logits
    assert decisive.float().mean() > 0.5
    assert torch.equal(fused.argmax(-1)[decisive], eager.argmax(-1)[decisive])
    assert (fused.argmax(-1) == eager.argmax(-1)).float().mean() >= 0.95
