"""LLM.generate's "Processed prompts" bar: requests that finish together in one engine step move
the bar together, so its rate and ETA reflect the wave (one request at a time, the bar redrew on
the first of each wave only and showed an ETA of hours for a run of seconds)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace
from typing import Any

import pytest
from pagedkv.engine import llm as llm_module
from pagedkv.engine.llm import LLM
from tqdm import tqdm


class WavesEngine:
    """Finishes `per_wave` requests every `steps_per_wave` steps of `step_s` seconds each."""

    def __init__(self, ids: list[str], per_wave: int, steps_per_wave: int, step_s: float) -> None:
        self.pending, self.per_wave = list(ids), per_wave
        self.steps_per_wave, self.step_s, self.steps = steps_per_wave, step_s, 0

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def take_request_errors(self) -> dict:
        return {}  # no request fails alone here

    def step(self) -> list[Any]:
        time.sleep(self.step_s)
        self.steps += 1
        if self.steps % self.steps_per_wave:
            return []
        wave, self.pending = self.pending[: self.per_wave], self.pending[self.per_wave :]
        return [
            SimpleNamespace(
                request_id=i, finished=True, outputs=[SimpleNamespace(token_ids=[1, 2, 3])]
            )
            for i in wave
        ]


def test_a_wave_of_finished_requests_moves_the_bar_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = io.StringIO()
    bars: list[Any] = []

    def progress(total: int, use_tqdm: bool) -> Any:
        bars.append(tqdm(total=total, file=shown, mininterval=0.05, ascii=True))
        return bars[-1]

    monkeypatch.setattr(llm_module, "_progress", progress)
    ids = [f"r{i}" for i in range(90)]
    llm = LLM.__new__(LLM)  # the run loop alone: no model
    llm.llm_engine = WavesEngine(ids, per_wave=30, steps_per_wave=3, step_s=0.05)
    outs = llm._run_engine(ids, use_tqdm=True)
    assert [o.request_id for o in outs] == ids
    frames = [f for f in shown.getvalue().split("\r") if "/90" in f]
    counts = {f.split("|")[2].split("/")[0].strip() for f in frames}
    assert counts <= {"0", "30", "60", "90"}, frames  # never 1/90 with a rate of one request
    assert bars[0].n == 90 and bars[0].total_out == 270
