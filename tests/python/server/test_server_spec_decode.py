"""`pagedkv serve --speculative-config` (n-gram, draft model): completions run speculatively and
/metrics reports vLLM's spec_decode counters under both prefixes."""

from __future__ import annotations

import json

import pytest
from support.deps import need

httpx = need("httpx")

from support.server import small_server  # noqa: E402

MODEL = "smol"
TEXT = "The cache hands out blocks of keys and values; finished sequences give their blocks back."
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    srv = small_server(
        tmp_path_factory,
        "server_spec",
        model=MODEL,
        extra_args=["--speculative-config", json.dumps(SPEC)],
    )
    yield srv
    srv.stop()


def test_speculative_completion_and_its_metrics(server) -> None:
    body = {
        "model": MODEL,
        "prompt": f"Repeat the text exactly.\nText: {TEXT}\nRepeated: {TEXT}\nRepeated:",
        "max_tokens": 40,
        "temperature": 0.0,
    }
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0
    m = server.wait_idle()
    for prefix in ("pagedkv:", "vllm:"):
        drafts = m[f"{prefix}spec_decode_num_draft_tokens_total"]
        accepted = m[f"{prefix}spec_decode_num_accepted_tokens_total"]
        assert m[f"{prefix}spec_decode_num_drafts_total"] > 0
        assert 0 < accepted <= drafts


def test_a_draft_model_served(tmp_path_factory: pytest.TempPathFactory) -> None:
    """--speculative-config with a draft model: the default model drafting for itself (its
    weights shared) agrees with the target on (nearly) every greedy draft."""
    spec = {"model": "smollm2", "num_speculative_tokens": 3}
    srv = small_server(
        tmp_path_factory,
        "server_spec_draft",
        model=MODEL,
        extra_args=["--speculative-config", json.dumps(spec)],
    )
    try:
        body = {"model": MODEL, "prompt": f"Text: {TEXT}\nRepeated:", "max_tokens": 16}
        r = httpx.post(srv.url + "/v1/completions", json={**body, "temperature": 0.0}, timeout=120)
        assert r.status_code == 200, r.text
        m = srv.wait_idle()
        drafts = m["vllm:spec_decode_num_draft_tokens_total"]
        assert drafts > 0
        assert m["vllm:spec_decode_num_accepted_tokens_total"] >= 0.9 * drafts
    finally:
        srv.stop()
