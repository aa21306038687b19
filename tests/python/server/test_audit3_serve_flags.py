"""Every `pagedkv serve` flag reaches the server: resolve() once kept only the flags listed in
serve.DEFAULTS, so `--lora-modules` was parsed and then silently dropped (no adapter served)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pagedkv.entrypoints.arg_types import CLIError
from pagedkv.entrypoints.cli import build_parser
from pagedkv.entrypoints.commands import serve


def parse(argv: list[str]) -> argparse.Namespace:
    return serve.resolve(build_parser().parse_args(["serve", *argv]))


def test_lora_modules_flag_and_config_key_reach_the_server(tmp_path: Path) -> None:
    opts = parse(["--lora-modules", "a=/x", '{"name": "b", "path": "/y"}'])
    assert opts.lora_modules == ["a=/x", '{"name": "b", "path": "/y"}']
    cfg = tmp_path / "config.yaml"
    cfg.write_text("lora-modules: [c=/z]\n")
    assert parse(["--config", str(cfg)]).lora_modules == ["c=/z"]
    assert parse([]).lora_modules is None


def test_every_serve_flag_is_resolved() -> None:
    """A flag whose value resolve() drops is accepted and ignored; vLLM's hidden engine flags,
    checked at parse time (their default or a refusal) and never stored, are the exception."""
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    dests = {
        a.dest
        for a in parser._actions
        if a.dest not in ("help", "config") and a.help is not argparse.SUPPRESS
    }
    assert dests - set(serve.DEFAULTS) == set()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lora-modules", "a=/x"], "need --enable-lora"),
        (["--enable-lora", "--lora-modules", "a"], "expected name=path"),
        (["--enable-lora", "--lora-modules", '{"name": "a"}'], "needs 'name' and 'path'"),
    ],
)
def test_bad_lora_modules_are_flag_errors_before_the_model_loads(argv, message) -> None:
    with pytest.raises(CLIError, match=f"argument --lora-modules: .*{message}"):
        serve.check_lora_modules(parse(argv))


def test_json_flag_errors_do_not_quote_another_flags_keys(capsys) -> None:
    """A bad --speculative-config showed '{"rope_theta": 1000000}' as the example."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative-config", "{bad"])
    err = capsys.readouterr().err
    assert "argument --speculative-config: must be a JSON object" in err
    assert "rope_theta" not in err
