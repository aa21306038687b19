"""Flag handling shared by every `pagedkv` command: vLLM's spellings everywhere, bad values
rejected argparse-style (usage + "error: argument --flag: ...", exit code 2) before any model
is loaded, and help text that states each default once. Nothing here loads a model."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from pagedkv.entrypoints import cli
from pagedkv.entrypoints.commands import serve
from pagedkv.entrypoints.engine_args import ENGINE_FLAGS

ENGINE_COMMANDS = ["generate Hi", "chat", "bench", "serve"]


def _argv(command: str, *flags: str) -> list[str]:
    return [*command.split(), *flags]


def _parse(command: str, *flags: str) -> argparse.Namespace:
    args = cli.build_parser().parse_args(_argv(command, *flags))
    return serve.resolve(args) if command == "serve" else args


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Runs the CLI, expecting an argparse-style rejection; returns its error line."""
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith("usage: pagedkv "), err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("command", [*ENGINE_COMMANDS, "simulate t.jsonl"])
def test_vllm_toggle_spellings_everywhere(command: str) -> None:
    on = _parse(command, "--enable-prefix-caching", "--enable-chunked-prefill")
    assert on.enable_prefix_caching is True and on.enable_chunked_prefill is True
    off = _parse(command, "--no-enable-prefix-caching", "--no-enable-chunked-prefill")
    assert off.enable_prefix_caching is False and off.enable_chunked_prefill is False
    default = _parse(command)
    assert default.enable_prefix_caching is True and default.enable_chunked_prefill is True


def test_old_simulate_spellings_still_work_but_warn(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parse("simulate t.jsonl", "--no-prefix-caching", "--no-chunked-prefill")
    assert args.enable_prefix_caching is False and args.enable_chunked_prefill is False
    assert "deprecated" in capsys.readouterr().err
    helptext = cli.build_parser()._subparsers._group_actions[0].choices["simulate"].format_help()
    assert "--no-prefix-caching" not in helptext and "--no-enable-prefix-caching" in helptext


@pytest.mark.parametrize("command", ENGINE_COMMANDS)
def test_every_engine_command_has_every_engine_flag(command: str) -> None:
    args = _parse(
        command,
        "--tokenizer",
        "tok",
        "--preemption-mode",
        "swap",
        "--swap-space",
        "2",
        "--enforce-eager",
        "--kv-cache-space",
        "0.5",
    )
    assert (args.tokenizer, args.preemption_mode, args.swap_space) == ("tok", "swap", 2.0)
    assert args.enforce_eager is True and args.kv_cache_space == 0.5
    sized = _parse(command, "--num-gpu-blocks-override", "64", "--max-seq-len-to-capture", "512")
    assert (sized.num_gpu_blocks_override, sized.max_seq_len_to_capture) == (64, 512)
    defaults = _parse(command)
    for flag in ENGINE_FLAGS:
        assert getattr(defaults, flag.dest) == flag.default, flag.dest


BAD_VALUES = [
    ("generate Hi", ["--max-tokens", "-5"], "--max-tokens"),
    ("generate Hi", ["--temperature", "-1"], "--temperature"),
    ("generate Hi", ["--top-p", "1.5"], "--top-p"),
    ("generate Hi", ["--top-p", "nan"], "--top-p"),
    ("generate Hi", ["--min-p", "2"], "--min-p"),
    ("generate Hi", ["-n", "0"], "-n"),
    ("generate Hi", ["--block-size", "7"], "--block-size"),
    ("generate Hi", ["--max-model-len", "-1"], "--max-model-len"),
    ("generate Hi", ["--max-num-seqs", "0"], "--max-num-seqs"),
    ("generate Hi", ["--dtype", "float64"], "--dtype"),
    ("generate Hi", ["--device", "tpu"], "--device"),
    ("generate Hi", ["--swap-space", "-1"], "--swap-space"),
    ("generate Hi", ["--max-logprobs", "-2"], "--max-logprobs"),
    ("generate Hi", ["--preemption-mode", "swap", "--swap-space", "0"], "--swap-space"),
    ("generate Hi", ["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
    ("chat", ["--kv-cache-space", "-2"], "--kv-cache-space"),
    ("chat", ["--repetition-penalty", "0"], "--repetition-penalty"),
    ("bench", ["--num-prompts", "0"], "--num-prompts"),
    ("bench", ["--input-len", "0"], "--input-len"),
    ("bench", ["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    ("serve", ["--num-gpu-blocks-override", "0"], "--num-gpu-blocks-override"),
    ("serve", ["--max-seq-len-to-capture", "0"], "--max-seq-len-to-capture"),
    ("serve", ["--skip-tokenizer-init"], "--skip-tokenizer-init"),
    ("generate Hi", ["--skip-tokenizer-init"], "--skip-tokenizer-init"),
    ("serve", ["--port", "-1"], "--port"),
    ("serve", ["--port", "99999"], "--port"),
    ("serve", ["--config", "/nonexistent/pagedkv.yaml"], "--config"),
    ("serve", ["--max-num-seqs", "0"], "--max-num-seqs"),
    ("serve", ["--preemption-mode", "swap", "--swap-space", "0"], "--swap-space"),
    ("simulate t.jsonl", ["--num-blocks", "0"], "--num-blocks"),
    ("simulate t.jsonl", ["--step-time-ms", "-1"], "--step-time-ms"),
    ("simulate /nonexistent/t.jsonl", [], "trace"),
]


@pytest.mark.parametrize("command,flags,name", BAD_VALUES)
def test_bad_values_are_usage_errors_before_loading(
    command: str,
    flags: list[str],
    name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pagedkv.engine import llm
    from pagedkv.entrypoints.openai import api_server

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(llm.LLM, "__init__", no_model)
    monkeypatch.setattr(api_server, "run_server", no_model)
    line = _usage_error(capsys, _argv(command, *flags))
    assert line.startswith(f"pagedkv {command.split()[0]}: error: argument {name}: "), line


def test_cuda_device_without_a_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    import pagedkv
    import torch

    if torch.cuda.is_available() and pagedkv.cuda_available():
        pytest.skip("a usable GPU is here")
    line = _usage_error(capsys, ["generate", "Hi", "--device", "cuda"])
    assert "argument --device: 'cuda': no usable CUDA GPU" in line


def _rendered_helps() -> list[tuple[str, argparse.Action, str]]:
    rows = []
    for name, sub in cli.build_parser()._subparsers._group_actions[0].choices.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if action.help is not argparse.SUPPRESS and action.dest != "help":
                rows.append((name, action, formatter._expand_help(action)))
    return rows


def test_help_states_each_default_once_and_correctly() -> None:
    for command, action, text in _rendered_helps():
        where = f"{command} {action.option_strings or action.dest}: {text!r}"
        assert text.count("(default") <= 1, where
        assert "(default: None)" not in text and "(default: True)" not in text, where
        if isinstance(action, argparse.BooleanOptionalAction):
            # (auto: a toggle left unset lets the engine choose, e.g. --async-scheduling)
            assert re.search(r"\(default: (on|off|auto)\)$", text), where
        elif action.nargs != 0 and action.option_strings:
            assert "(default" in text, where  # a value flag says what happens without it
            default = serve.DEFAULTS.get(action.dest) if command == "serve" else action.default
            if isinstance(default, list):  # list flags take JSON, and say their default so
                default = json.dumps(default)
            if default is not None and not isinstance(default, bool):
                assert f"(default: {default}" in text, where


def test_kv_cache_space_says_what_the_engine_does() -> None:
    texts = {t for _, a, t in _rendered_helps() if "--kv-cache-space" in a.option_strings}
    assert len(texts) == 1, texts  # one definition, shared by every command
    (text,) = texts
    assert "CPU" in text and "ignored on a GPU" in text and "(default: 4 GiB)" in text


def test_serve_config_values_are_type_checked(tmp_path, capsys) -> None:  # type: ignore
    cases = {
        'port: "abc"\n': "key 'port': must be a TCP port number",
        "enable-prefix-caching: maybe\n": "key 'enable-prefix-caching': must be true or false",
        "max-num-seqs: 0\n": "key 'max-num-seqs': must be an integer >= 1",
        "block_size: 16.5\n": "key 'block_size': must be a power of two",
        "port: [1\n": "is not valid YAML",
        "- 1\n": "expected a mapping",
    }
    for i, (text, message) in enumerate(cases.items()):
        cfg = tmp_path / f"c{i}.yaml"
        cfg.write_text(text)
        line = _usage_error(capsys, ["serve", "--config", str(cfg)])
        assert "error: argument --config: " in line and message in line, (text, line)
    cfg = tmp_path / "ok.yaml"
    cfg.write_text(
        "port: 8001\ngpu-memory-utilization: 0.5\nmax-model-len: null\n"
        "served-model-name: a\npreemption-mode: swap\nenforce-eager: true\n"
    )
    opts = _parse("serve", "--config", str(cfg))
    assert (opts.port, opts.gpu_memory_utilization, opts.max_model_len) == (8001, 0.5, None)
    assert opts.served_model_name == ["a"] and opts.preemption_mode == "swap"
    assert opts.enforce_eager is True
