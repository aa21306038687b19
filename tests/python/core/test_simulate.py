"""`pagedkv simulate`: replays a trace through the real scheduler and reports / plots it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pagedkv.entrypoints.cli import main
from pagedkv.simulator import TraceRequest, load_trace, simulate
from support.deps import need

SAMPLE = Path(__file__).resolve().parents[3] / "benchmarks" / "traces" / "sample.jsonl"


def test_simulate_command_reports_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need("matplotlib")
    png, out = tmp_path / "sim.png", tmp_path / "sim.json"
    rc = main(
        [
            "simulate",
            str(SAMPLE),
            "--num-blocks",
            "512",
            "--plot",
            str(png),
            "--json",
            str(out),
            "--print-every",
            "500",
        ]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "preemptions" in text and "prefix_hit_rate" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    trace = load_trace(SAMPLE)
    s = data["summary"]
    assert s["requests"] == len(trace) and s["leaked_blocks"] == 0
    assert s["output_tokens"] == sum(r.output_len for r in trace)
    assert s["preemptions"] > 0, "512 blocks is tight for this trace"
    assert s["prefix_hit_tokens"] > 0, "the trace has shared-prefix groups"
    steps = data["steps"]
    assert all(st["budget_use"] <= 1.0 for st in steps)
    assert len(steps) == s["steps"]
    assert sum(st["num_sampled"] for st in steps) == s["output_tokens"]


def test_simulate_counts_every_token_and_respects_budgets() -> None:
    from pagedkv import SchedulerConfig

    trace = [
        TraceRequest(arrival_time=0.01 * i, prompt_len=50 + 7 * i, output_len=5 + i)
        for i in range(20)
    ]
    cfg = SchedulerConfig(64, 8, max_num_seqs=6, max_num_batched_tokens=96)
    res = simulate(trace, cfg)
    assert max(st.num_seqs for st in res.steps) <= 6
    assert max(st.num_prefill_tokens + st.num_decode_tokens for st in res.steps) <= 96
    # Every output token was sampled exactly once, preemptions or not.
    assert sum(st.num_sampled for st in res.steps) == sum(r.output_len for r in trace)
    assert sum(st.num_decode_tokens for st in res.steps) <= sum(r.output_len - 1 for r in trace)
    assert len(res.latency) == len(trace) and res.summary["leaked_blocks"] == 0


def test_bad_trace_line_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_time": 0, "prompt_len": 5, "output_len": 2}\n{"prompt_len": 3}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_trace(bad)


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ('{"arrival_time": -5, "prompt_len": 10, "output_len": 5}', "arrival_time"),
        ('{"arrival_time": NaN, "prompt_len": 10, "output_len": 5}', "arrival_time"),
        ('{"arrival_time": "0", "prompt_len": 10, "output_len": 5}', "arrival_time"),
        ('{"arrival_time": 0, "prompt_len": "10", "output_len": 5}', "prompt_len"),
        ('{"arrival_time": 0, "prompt_len": 10, "output_len": 5.5}', "output_len"),
        ('{"arrival_time": 0, "prompt_len": true, "output_len": 5}', "prompt_len"),
        ('{"arrival_time": 0, "prompt_len": 0, "output_len": 5}', "prompt_len"),
        ('{"arrival_time": 0, "prompt_len": 10, "output_len": 4294967296}', "output_len"),
        ('{"arrival_time": 0, "prompt_len": 10, "output_len": 5, "prefix_len": "4"}', "prefix_len"),
        (
            '{"arrival_time": 0, "prompt_len": 10, "output_len": 5, "priority": 2147483648}',
            "priority",
        ),
        (
            '{"arrival_time": 0, "prompt_len": 10, "output_len": 5, "prefix_group": [1]}',
            "prefix_group",
        ),
        ("[0, 10, 5]", "JSON object"),
    ],
)
def test_bad_trace_field_names_the_record_and_field(
    tmp_path: Path, record: str, field: str
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_time": 0, "prompt_len": 5, "output_len": 2}\n' + record + "\n")
    with pytest.raises(ValueError, match=rf"bad.jsonl:2: .*{field}"):
        load_trace(bad)


def test_trace_accepts_integral_floats_and_optional_fields(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(
        '{"arrival_time": 1, "prompt_len": 10.0, "output_len": 5, '
        '"prefix_group": "sys", "prefix_len": null, "priority": -3}\n'
    )
    (req,) = load_trace(good)
    assert req == TraceRequest(
        arrival_time=1.0,
        prompt_len=10,
        output_len=5,
        prefix_group="sys",
        prefix_len=None,
        priority=-3,
    )
    assert isinstance(req.prompt_len, int)


def test_simulate_command_reports_a_bad_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_time": -5, "prompt_len": "10", "output_len": 5.5}\n')
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(bad)])
    err = capsys.readouterr().err
    assert exc.value.code != 0
    assert "bad.jsonl:1" in err and "arrival_time" in err
