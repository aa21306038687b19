"""Step-by-step decoding through ContiguousCacheBackend (chunked prefill, then decodes of a
mixed batch) gives the logits of one dense forward over each whole sequence."""

from __future__ import annotations

import pytest
from support.deps import need

torch = need("torch")

from pagedkv.models import load_model  # noqa: E402
from pagedkv.models.reference_backend import (  # noqa: E402
    ContiguousCacheBackend,
    DenseAttentionBackend,
)
from pagedkv.testing import save_random_model  # noqa: E402


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-opt"])
def test_chunked_and_decode_steps_match_dense(preset: str, tmp_path) -> None:
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    path = save_random_model(
        str(tmp_path / preset), preset, seed=seed, tokenizer=False, vocab_size=300
    )
    model, cfg = load_model(path, torch.float32, "cpu")
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, 300, (n,), generator=g) for n in (19, 6, 11)]
    dense = []
    for s in seqs:
        h = model(s, torch.arange(len(s)), DenseAttentionBackend())
        dense.append(model.compute_logits(h))

    backend = ContiguousCacheBackend(cfg.num_hidden_layers)
    got = [[] for _ in seqs]
    done = [0] * len(seqs)
    rng = torch.Generator().manual_seed(seed + 1)
    while any(d < len(s) for d, s in zip(done, seqs)):
        # each step, every unfinished sequence feeds a random chunk (1..5 tokens)
        ids, pos, sids, lens = [], [], [], []
        for i, s in enumerate(seqs):
            if done[i] == len(s):
                continue
            n = min(int(torch.randint(1, 6, (), generator=rng)), len(s) - done[i])
            ids.append(s[done[i] : done[i] + n])
            pos.append(torch.arange(done[i], done[i] + n))
            sids.append(i)
            lens.append(n)
        backend.begin_step(sids, lens)
        logits = model.compute_logits(model(torch.cat(ids), torch.cat(pos), backend))
        for i, part in zip(sids, logits.split(lens)):
            got[i].append(part)
            done[i] += part.shape[0]
    for i in range(len(seqs)):
        assert backend.context_len(i) == len(seqs[i])
        torch.testing.assert_close(torch.cat(got[i]), dense[i], rtol=1e-5, atol=1e-5)
        backend.free(i)
    assert not backend.cache
