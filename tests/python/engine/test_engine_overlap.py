"""Overlapped scheduling (async_scheduling=True) gives the serial loop's outputs, and the
scheduler alone decides finishing (several EOS ids, stop ids, min_tokens, max_tokens).

Overlapped, step N+1 is scheduled and run before step N's tokens reach the host: a sequence
that step N finished by a token still runs in step N+1 and that row is dropped; the inputs of
N+1 are filled in on the device. Each case runs the same requests serially and overlapped on a
tiny random Llama (CPU, float32) and compares every token, finish reason and stop reason;
the cases force what exercises the overlap: stop ids and EOS ids mid-output, chunked prefill,
preemption (recompute and swap), n > 1 forks with seeded sampling and logprobs, stop strings
(found one step late), aborts and a failing step.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from support.deps import need
from support.engine import assert_no_leak

torch = need("torch")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.model_runner import ModelRunner  # noqa: E402
from pagedkv.testing import save_random_model  # noqa: E402

VOCAB = 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("tiny_overlap"))
    return save_random_model(
        out,
        "tiny-llama",
        seed=5,
        tokenizer=False,
        head_dim=32,  # wider heads than the preset's 16
        vocab_size=VOCAB,
        max_position_embeddings=512,
    )


def _llm(path: str, overlap: bool, **kw) -> LLM:
    kw = {
        "skip_tokenizer_init": True,
        "block_size": 4,
        "num_gpu_blocks_override": 64,
        "max_model_len": 96,
        **kw,
    }
    return LLM(path, device="cpu", dtype="float32", seed=0, async_scheduling=overlap, **kw)


def _prompts(n: int, seed: int, lo: int = 4, hi: int = 30) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, int(rng.integers(lo, hi))).tolist() for _ in range(n)]


def _run(llm: LLM, prompts, params) -> list[tuple]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    assert_no_leak(llm)
    return [
        (
            o.request_id,
            [
                (
                    c.index,
                    c.token_ids,
                    c.finish_reason,
                    c.stop_reason,
                    c.text,
                    _lps(c.logprobs),
                    # The samples fork a step later overlapped, so rows share a batch with
                    # other rows than serially: float32 sums agree to rounding only.
                    None if c.cumulative_logprob is None else round(c.cumulative_logprob, 4),
                )
                for c in o.outputs
            ],
            _lps(o.prompt_logprobs),
        )
        for o in outs
    ]


def _lps(lps) -> list:
    return [
        None if d is None else sorted((t, round(lp.logprob, 4), lp.rank) for t, lp in d.items())
        for d in lps or []
    ]


def _both(path: str, prompts, params, **kw) -> list[tuple]:
    """The outputs, checked equal serial vs overlapped."""
    serial = _run(_llm(path, False, **kw), prompts, params)
    overlapped = _run(_llm(path, True, **kw), prompts, params)
    assert overlapped == serial
    return serial


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, **kw)


def _stop_ids(path: str, prompts) -> list[int]:
    """Tokens the greedy outputs produce mid-way, so that stopping on them ends requests at
    different steps."""
    outs = _run(_llm(path, False), prompts, _greedy(20, ignore_eos=True))
    return sorted({o[1][0][1][k] for o, k in zip(outs, range(3, 3 + len(outs)))})


def test_stop_ids_and_lengths_finish_as_serially(model_dir: str) -> None:
    prompts = _prompts(8, 1)
    stops = _stop_ids(model_dir, prompts)
    params = [
        _greedy(6 + 3 * i, ignore_eos=True, stop_token_ids=stops[: 2 + i % 3], min_tokens=i % 4)
        for i in range(8)
    ]
    out = _both(model_dir, prompts, params)
    reasons = [c[2] for _, cs, _ in out for c in cs]
    assert "stop" in reasons and "length" in reasons  # both kinds of finish happened


def test_several_eos_ids_stop_in_the_scheduler(model_dir: str, tmp_path) -> None:
    # generation_config-style eos lists: every EOS id ends the output, reported as "stop"
    # with no stop_reason; ignore_eos keeps going.
    prompts = _prompts(6, 2)
    eos = _stop_ids(model_dir, prompts)[:3]
    path = str(tmp_path / "multi_eos")
    os.makedirs(path)
    for name in ("model.safetensors",):
        os.symlink(os.path.join(model_dir, name), os.path.join(path, name))
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = eos
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    out = _both(path, prompts, _greedy(20))
    free = _run(_llm(path, False), prompts, _greedy(20, ignore_eos=True))
    for (_, cs, _), (_, full, _) in zip(out, free):
        toks, reason, stop_reason = cs[0][1], cs[0][2], cs[0][3]
        first = next((k for k, t in enumerate(full[0][1]) if t in eos), None)
        if first is None:
            assert (toks, reason) == (full[0][1], "length")
        else:
            assert (toks, reason, stop_reason) == (full[0][1][: first + 1], "stop", None)
    assert any(cs[0][2] == "stop" for _, cs, _ in out)


def test_chunked_prefill_and_preemption(model_dir: str) -> None:
    prompts = _prompts(5, 3, 16, 40)
    stops = _stop_ids(model_dir, prompts)
    params = [_greedy(10 + i, ignore_eos=True, stop_token_ids=stops[: 1 + i % 2]) for i in range(5)]
    for mode in ("recompute", "swap"):
        llm_kw = {
            "max_num_batched_tokens": 24,
            "num_gpu_blocks_override": 16,
            "preemption_mode": mode,
            "enable_prefix_caching": mode == "recompute",
            **({"num_cpu_blocks": 64} if mode == "swap" else {}),
        }
        serial = _llm(model_dir, False, **llm_kw)
        overlapped = _llm(model_dir, True, **llm_kw)
        assert _run(overlapped, prompts, params) == _run(serial, prompts, params)
        assert overlapped.llm_engine.scheduler.num_preemptions > 0, "the cache was not tight"


def test_forks_seeds_and_logprobs(model_dir: str) -> None:
    prompts = _prompts(4, 4)
    stops = _stop_ids(model_dir, prompts)
    params = [
        SamplingParams(
            n=3,
            best_of=3 + i % 2,
            temperature=0.8,
            seed=10 + i,
            max_tokens=10,
            logprobs=2,
            prompt_logprobs=1 if i == 0 else None,
            stop_token_ids=stops[:1],
            ignore_eos=True,
        )
        for i in range(4)
    ]
    out = _both(model_dir, prompts, params)
    assert all(len(cs) == 3 for _, cs, _ in out)


def test_stop_strings_found_a_step_late_are_cut_the_same(tmp_path) -> None:
    path = save_random_model(
        str(tmp_path / "text"),
        "tiny-llama",
        seed=3,
        tokenizer=True,
        head_dim=32,  # wider heads than the preset's 16
        max_position_embeddings=512,
    )
    prompts = _prompts(3, 5, 3, 8)
    free = _run(_llm(path, False, skip_tokenizer_init=False), prompts, _greedy(12, ignore_eos=True))
    # A piece of each output's text, so that each request stops on it part way.
    stops = [cs[0][4][len(cs[0][4]) // 2 :][:2] for _, cs, _ in free]
    params = [_greedy(12, ignore_eos=True, stop=[s]) for s in stops if s]
    out = _both(path, prompts[: len(params)], params, skip_tokenizer_init=False)
    assert any(cs[0][2] == "stop" and isinstance(cs[0][3], str) for _, cs, _ in out)


def test_abort_while_a_step_is_in_flight(model_dir: str) -> None:
    prompts = _prompts(4, 6)
    ref = _run(_llm(model_dir, False), prompts, _greedy(10, ignore_eos=True))
    llm = _llm(model_dir, True)
    eng = llm.llm_engine
    for i, p in enumerate(prompts):
        eng.add_request(str(i), {"prompt_token_ids": p}, _greedy(10, ignore_eos=True))
    done = {}
    for step in range(100):
        if step == 3:
            eng.abort_request("1")
        for o in eng.step():
            if o.finished:
                done[o.request_id] = (o.outputs[0].token_ids, o.outputs[0].finish_reason)
        if not eng.has_unfinished_requests():
            break
    assert sorted(done) == ["0", "2", "3"]
    assert all(done[r] == (ref[int(r)][1][0][1], "length") for r in done)
    assert_no_leak(llm)


def test_a_failed_overlapped_step_leaves_the_engine_usable(model_dir: str, monkeypatch) -> None:
    prompts = _prompts(3, 7)
    params = _greedy(8, ignore_eos=True)
    llm = _llm(model_dir, True)
    ref = _run(llm, prompts, params)
    real, calls = ModelRunner.execute, [0]

    def flaky(self, plan, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 3:  # a step in flight and the next one launching
            raise RuntimeError("device error")
        return real(self, plan, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "execute", flaky)
    with pytest.raises(RuntimeError, match="device error"):
        llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    monkeypatch.undo()
    assert not llm.llm_engine.seq_owner
    assert_no_leak(llm)
    assert [o[1:] for o in _run(llm, prompts, params)] == [o[1:] for o in ref]  # new ids


def test_structured_outputs_and_logits_processors(tmp_path) -> None:
    # The matcher of each sample accepts token t before the bitmask for t + 1 is filled, and a
    # logits processor sees every earlier token, overlapped as serially: same greedy outputs.
    need("xgrammar")
    from pagedkv.engine.structured_output import StructuredOutputsParams

    path = save_random_model(
        str(tmp_path / "grammar"),
        "tiny-llama",
        seed=7,
        tokenizer=True,
        head_dim=32,  # wider heads than the preset's 16
        max_position_embeddings=512,
    )
    schema = {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["color", "count"],
    }

    def no_repeat(out: list, logits: torch.Tensor) -> torch.Tensor:
        if out:  # ban the last token: depends on every token the step before gave
            logits[out[-1]] = float("-inf")
        return logits

    params = [
        _greedy(40, structured_outputs=StructuredOutputsParams(json=schema)),
        _greedy(12, structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"])),
        _greedy(10, ignore_eos=True, logits_processors=[no_repeat]),
        _greedy(10, ignore_eos=True),
    ]
    prompts = _prompts(4, 8, 3, 8)
    out = _both(path, prompts, params, skip_tokenizer_init=False, max_model_len=128)
    record = json.loads(out[0][1][0][4])
    assert record["color"] in ("red", "green", "blue") and 0 <= record["count"] <= 99
    assert out[1][1][0][4] in ("yes", "no", "maybe")
    toks = out[2][1][0][1]
    assert all(a != b for a, b in zip(toks, toks[1:]))
