"""The structured-output bitmask off the step's critical path (engine/structured_bitmask.py).

The next step's bitmask is filled in a worker thread as soon as the matchers took a step's
tokens; the step then takes its rows without filling on the main thread. Checked here without
a GPU: the rows a step takes equal xgrammar's own fill of the same matchers whatever the order,
staleness or size of the batch (against GrammarCache.fill_bitmask, the plain batch call); in
the engine, serial and overlapped, every decode row is served by a fill that ran on the worker
thread and started before the step that samples it was launched, no tensor is read back on the
main thread between the forward's launch and the bitmask's hand-over (where a GPU step would
wait for the device), and the tokens equal those of the same engine with the prefetch off.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Dict, List

import pytest
from support.deps import need, need_random_tokenizer

torch = need("torch")
need("transformers")
need("xgrammar")
jsonschema = need("jsonschema")

from pagedkv import LLM, SamplingParams  # noqa: E402
from pagedkv.engine.model_runner import ModelRunner  # noqa: E402
from pagedkv.engine.request_state import SeqState  # noqa: E402
from pagedkv.engine.structured_bitmask import StructuredBitmask  # noqa: E402
from pagedkv.engine.structured_output import (  # noqa: E402
    GrammarCache,
    StructuredOutputsParams,
)
from pagedkv.testing import default_tokenizer, save_random_model  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 49152  # SmolLM2's tokenizer


@pytest.fixture(scope="module")
def grammars() -> GrammarCache:
    need_random_tokenizer()  # (SmolLM2's: the GPU machine carries it without the model)
    tok = default_tokenizer()
    return GrammarCache(tok.hf, VOCAB, [tok.eos_token_id])


def _seq(cache: GrammarCache, compiled: Any, tokens: List[int]) -> SeqState:
    seq = SeqState(0, matcher=cache.matcher(compiled))
    for t in tokens:
        assert seq.matcher.accept_token(t)
        seq.token_ids.append(t)
    return seq


def _first_allowed(mask: torch.Tensor) -> int:
    words = mask[0].tolist()
    j = next(i for i, w in enumerate(words) if w != 0)
    return 32 * j + ((words[j] & -words[j]).bit_length() - 1)


def test_take_matches_xgrammar_fill(grammars: GrammarCache) -> None:
    regex = grammars.get(StructuredOutputsParams(regex="[a-c]{2,5}(x|yz)"))
    choice = grammars.get(StructuredOutputsParams(choice=["apple", "banana", "cherry"]))
    a, b, d = _seq(grammars, regex, []), _seq(grammars, choice, []), _seq(grammars, regex, [])
    step = grammars.fill_bitmask([a.matcher])
    assert step is not None
    tok = _first_allowed(step)
    for s in (a, d):  # a and d now differ from a fresh matcher
        assert s.matcher.accept_token(tok)
        s.token_ids.append(tok)
    bitmask = StructuredBitmask(grammars, max_rows=8)
    cpu = torch.device("cpu")

    # In order: the prefetched rows themselves.
    bitmask.prefetch([a, b])
    got = bitmask.take([a, b], cpu)
    assert got is not None and bitmask.prefetched == 2
    assert torch.equal(got, grammars.fill_bitmask([a.matcher, b.matcher]))

    # Reordered, a row without a matcher, a sample the prefetch did not see (e), and one whose
    # matcher took a token since (d: stale, filled again).
    e, free = _seq(grammars, choice, []), SeqState(1)
    bitmask.prefetch([a, b, d])
    bitmask._pending[0].result()  # type: ignore[index]  # (the fill is done; d moves on)
    tok = _first_allowed(grammars.fill_bitmask([d.matcher]))  # type: ignore[arg-type]
    assert d.matcher.accept_token(tok)
    d.token_ids.append(tok)
    rows = [d, free, b, e, a]
    got = bitmask.take(rows, cpu)
    want = grammars.fill_bitmask([s.matcher for s in rows])
    assert got is not None and want is not None and torch.equal(got, want)
    assert bitmask.prefetched == 2 + 2  # b and a

    # More rows than the buffers hold (an n > 1 fan-out): filled there, still exact.
    small = StructuredBitmask(grammars, max_rows=2)
    small.prefetch(rows)
    got = small.take(rows, cpu)
    assert got is not None and torch.equal(got, want)
    assert bitmask.take([free, None], cpu) is None  # nothing constrained


def test_tokens_queued_then_taken_in_one_call(grammars: GrammarCache) -> None:
    # accept_later queues the token (whether it ends the grammar is known at once: one of the
    # grammar's stop tokens); accept_queued has the matchers take them before the next fill.
    choice = grammars.get(StructuredOutputsParams(choice=["ab", "cd"]))
    seq, ref = _seq(grammars, choice, []), grammars.matcher(choice)
    bitmask = StructuredBitmask(grammars, max_rows=4)
    req: Any = object()  # (only handed back with a refusal)
    first = grammars.fill_bitmask([ref])
    assert first is not None
    tok = _first_allowed(first)
    assert ref.accept_token(tok)
    assert not bitmask.accept_later(req, seq, tok)
    seq.token_ids.append(tok)
    assert bitmask.accept_queued() == []
    bitmask.prefetch([seq])
    got = bitmask.take([seq], torch.device("cpu"))
    assert got is not None and bitmask.prefetched == 1
    assert torch.equal(got, grammars.fill_bitmask([ref]))
    eos = next(iter(grammars.stop_token_ids))
    # A token the matcher refuses (sampled outside its bitmask: an engine bug) is reported
    # with its request.
    assert bitmask.accept_later(req, _seq(grammars, choice, []), eos)  # (ends it? known: yes)
    refused = bitmask.accept_queued()
    assert [r for r, _ in refused] == [req] and "does not allow" in str(refused[0][1])


SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "count", "ok"],
}


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> LLM:
    out = str(tmp_path_factory.mktemp("tiny_bitmask"))
    path = save_random_model(
        out, "tiny-llama", seed=7, head_dim=32, vocab_size=VOCAB, max_position_embeddings=256
    )
    return LLM(path, device="cpu", dtype="float32", block_size=8, max_model_len=128, seed=0)


def _params() -> List[SamplingParams]:
    so = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    constrained = [
        SamplingParams(temperature=0.8, max_tokens=32, seed=i, structured_outputs=so)
        for i in range(3)
    ]
    return constrained + [SamplingParams(temperature=0.8, max_tokens=12, seed=9)]


def _tokens(llm: LLM) -> List[List[int]]:
    prompts = [f"Give me record {i} as JSON:" for i in range(4)]
    outs = llm.generate(prompts, _params(), use_tqdm=False)
    for o in outs[:3]:  # (a random model: the bounded schema completes or is cut by length)
        c = o.outputs[0]
        if c.finish_reason == "stop":
            jsonschema.validate(json.loads(c.text), SCHEMA)
        else:
            assert c.finish_reason == "length"
    assert sum(o.outputs[0].finish_reason == "stop" for o in outs[:3]) >= 1
    return [list(o.outputs[0].token_ids) for o in outs]


class _Timeline:
    """What happened on which thread, in order: forward launches, bitmask fills (and on which
    thread they ran), take() calls, and main-thread tensor reads between a launch and the
    take that follows it (each would wait for the device on a GPU)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: List[Dict[str, Any]] = []
        self.reads_in_window: List[str] = []
        self._window = False
        main = threading.main_thread()
        log = self.events

        def wrap(owner: Any, name: str, kind: str) -> None:
            real = getattr(owner, name)

            def traced(*a: Any, **kw: Any) -> Any:
                t0 = time.perf_counter()
                out = real(*a, **kw)
                on_main = threading.current_thread() is main
                t1 = time.perf_counter()
                log.append({"kind": kind, "t0": t0, "t1": t1, "main": on_main, "none": out is None})
                if kind == "launch":
                    self._window = True
                elif kind == "take":
                    self._window = False
                return out

            monkeypatch.setattr(owner, name, traced)

        wrap(ModelRunner, "execute", "launch")
        wrap(StructuredBitmask, "take", "take")
        wrap(GrammarCache, "fill_rows", "fill")
        for name in ("item", "tolist", "cpu", "numpy"):
            self._count_reads(monkeypatch, name, main)

    def _count_reads(self, monkeypatch: pytest.MonkeyPatch, name: str, main: Any) -> None:
        real = getattr(torch.Tensor, name)

        def read(t: Any, *a: Any, **kw: Any) -> Any:
            if self._window and threading.current_thread() is main:
                self.reads_in_window.append(name)
            return real(t, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, read)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial", "overlapped"])
def test_fill_runs_off_the_main_thread_before_the_launch(
    llm: LLM, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = llm.llm_engine.core
    core.set_async_scheduling(overlap)
    try:
        timeline = _Timeline(monkeypatch)
        got = _tokens(llm)
        monkeypatch.undo()
        assert core.bitmask is not None
        # Every row filled at take(), on the main thread.
        monkeypatch.setattr(core.bitmask, "prefetch", lambda seqs: None)
        assert _tokens(llm) == got  # the prefetch changes no token
    finally:
        core.set_async_scheduling(False)
    ev = timeline.events
    assert not timeline.reads_in_window, timeline.reads_in_window
    worker_fills = [e for e in ev if e["kind"] == "fill" and not e["main"]]
    main_fills = [e for e in ev if e["kind"] == "fill" and e["main"]]
    # Main-thread fills only for the rows no prefetch could know: the 3 first samples (all in
    # the step that completes the prompts).
    assert len(main_fills) == 1
    takes = [e for e in ev if e["kind"] == "take" and not e["none"]]  # (rows constrained)
    assert len(worker_fills) >= len(takes) - 1 >= 5
    launches = [e["t0"] for e in ev if e["kind"] == "launch"]
    for take in takes[1:]:
        # The fill this take used ran on the worker, and started before the forward of the
        # step that samples it was launched (serially: while the host processed outputs and
        # scheduled), so the main thread never waited for a whole fill.
        launch = max(t for t in launches if t < take["t0"])
        fill = max((f for f in worker_fills if f["t0"] < take["t0"]), key=lambda f: f["t0"])
        if not overlap:
            assert fill["t0"] < launch
        assert fill["t0"] > max((t["t1"] for t in takes if t["t1"] < fill["t0"]), default=0)
