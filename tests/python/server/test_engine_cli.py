"""The generate / chat / bench CLI commands on the default model (in-process, CPU)."""

from __future__ import annotations

import io
import json

import pytest
from support.deps import need

torch = need("torch")
need("gguf")

from pagedkv.entrypoints import cli  # noqa: E402

pytestmark = pytest.mark.slow

ENGINE = ["--device", "cpu", "--kv-cache-space", "0.1", "--max-model-len", "512"]


@pytest.fixture(scope="module")
def greedy_reference(smollm2_gguf: str):
    """An LLM kept alive for the module, so the CLI runs reuse its loaded weights."""
    from pagedkv import LLM, SamplingParams

    llm = LLM(device="cpu", kv_cache_space=0.1, max_model_len=512)
    out = llm.generate(
        "The capital of France is", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False
    )[0]
    yield llm, out.outputs[0].text


def test_generate_prints_greedy_completion(greedy_reference, capsys):
    _, text = greedy_reference
    assert cli.main(["generate", "The capital of France is", "--max-tokens", "12", *ENGINE]) == 0
    out = capsys.readouterr().out
    assert out.startswith("The capital of France is" + text)
    assert cli.main(["generate", "Hi", "Hello", "--max-tokens", "4", "--json", *ENGINE]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == ["Hi", "Hello"]
    assert all(r["num_tokens"] == 4 and r["finish_reason"] == "length" for r in rows)


def test_generate_with_an_fp8_kv_cache(greedy_reference, capsys, monkeypatch):
    from pagedkv.engine.config import EngineConfig

    built = []
    real = EngineConfig.from_kwargs.__func__

    def recording(cls, *args, **kwargs):
        built.append(real(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(EngineConfig, "from_kwargs", classmethod(recording))
    argv = ["generate", "The capital of France is", "--max-tokens", "4", "--kv-cache-dtype", "fp8"]
    assert cli.main([*argv, *ENGINE]) == 0
    assert [c.kv_cache_dtype for c in built] == ["fp8"]
    assert capsys.readouterr().out.startswith("The capital of France is")


def test_generate_passes_the_cache_and_graph_sizes(greedy_reference, capsys, monkeypatch):
    """--num-gpu-blocks-override / --max-seq-len-to-capture (vLLM's) reach the engine."""
    from pagedkv.engine.config import EngineConfig

    built = []
    real = EngineConfig.from_kwargs.__func__

    def recording(cls, *args, **kwargs):
        built.append(real(cls, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(EngineConfig, "from_kwargs", classmethod(recording))
    sizes = ["--num-gpu-blocks-override", "40", "--max-seq-len-to-capture", "256"]
    argv = ["generate", "The capital of France is", "--max-tokens", "4", *sizes]
    assert cli.main([*argv, *ENGINE]) == 0
    assert [(c.num_gpu_blocks_override, c.max_seq_len_to_capture) for c in built] == [(40, 256)]
    assert capsys.readouterr().out.startswith("The capital of France is")


def test_chat_streams_and_exits(greedy_reference, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 2+2?\n/exit\n"))
    assert cli.main(["chat", "--temperature", "0", "--max-tokens", "16", *ENGINE]) == 0
    out = capsys.readouterr().out
    assert out.strip()  # the reply was printed
    llm, _ = greedy_reference
    from pagedkv import SamplingParams

    conv = [{"role": "user", "content": "What is 2+2?"}]
    ref = llm.chat(conv, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    assert ref.outputs[0].text.strip() in out


def test_chat_reports_a_too_long_message_and_goes_on(greedy_reference, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("word " * 40 + "\nHi\n/exit\n"))
    argv = ["chat", "--temperature", "0", "--max-tokens", "2", *ENGINE, "--max-model-len", "32"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert "error: prompt is" in captured.err and "max_model_len=32" in captured.err
    assert captured.err.count("error:") == 1  # the next message ("Hi") fits and is answered
    assert captured.out.replace(">", "").strip()


def test_bench_reports_throughput(greedy_reference, capsys):
    args = ["bench", "--num-prompts", "3", "--input-len", "8", "--output-len", "4", "--json"]
    assert cli.main(args + ENGINE) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["num_prompts"] == 3 and result["output_tokens_per_s"] > 0


def test_every_flag_has_help():
    parser = cli.build_parser()
    for action in parser._subparsers._group_actions[0].choices.values():  # type: ignore
        for a in action._actions:
            if a.dest != "help":
                assert a.help, f"{action.prog} {a.option_strings or a.dest} has no help"


def test_engine_setup_errors_name_the_flag(greedy_reference, capsys):
    """Values only the loaded model can judge are still reported as flag errors (exit code 2,
    no traceback)."""
    cases = [
        (
            ["generate", "Hi", *ENGINE, "--max-model-len", "100000"],
            "argument --max-model-len: max_model_len=100000 is larger than",
        ),
        (["generate", "Hi", *ENGINE, "--tokenizer", "/nonexistent/tok"], "argument --tokenizer: "),
        (
            ["generate", "Hi " * 40, *ENGINE, "--max-model-len", "16"],
            "argument --max-model-len: prompt is",
        ),
        (
            ["bench", "--input-len", "500", "--output-len", "20", *ENGINE],
            "argument --output-len: --input-len + --output-len = 520 exceeds max_model_len=512",
        ),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and "Traceback" not in err, err
        assert message in err.strip().splitlines()[-1], err
