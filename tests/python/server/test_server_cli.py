"""`pagedkv serve` argument handling: defaults < $PAGEDKV_API_KEY < --config file < flags.
No model is loaded here."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pagedkv.entrypoints.arg_types import CLIError
from pagedkv.entrypoints.cli import build_parser
from pagedkv.entrypoints.commands import serve


def parse(argv: list[str]) -> argparse.Namespace:
    return serve.resolve(build_parser().parse_args(["serve", *argv]))


def engine_kwargs(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> dict:
    """What `serve` with ``argv`` passes to the engine: a stand-in AsyncLLMEngine.__init__
    records it (no model load)."""
    from pagedkv.engine.async_llm_engine import AsyncLLMEngine

    given: dict = {}
    monkeypatch.setattr(AsyncLLMEngine, "__init__", lambda self, **kw: given.update(kw))
    AsyncLLMEngine.from_engine_args(parse(argv))
    return given


# Engine flags of `generate` that `serve` takes too.
GENERATE_FLAGS = [
    "--tokenizer",
    "tok",
    "--preemption-mode",
    "swap",
    "--swap-space",
    "1.5",
    "--enforce-eager",
]


def test_defaults_are_vllms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(serve.API_KEY_ENV, raising=False)
    opts = parse([])
    assert (opts.host, opts.port, opts.api_key, opts.model) == ("0.0.0.0", 8000, None, None)
    assert opts.enable_prefix_caching and opts.enable_chunked_prefill
    assert opts.block_size == 16 and opts.max_num_seqs == 256


def test_config_file_then_flags_win(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "from-env")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        'host: "127.0.0.1"\nport: 6379\nuvicorn-log-level: "warning"\n'
        "enable_prefix_caching: false\nmax-model-len: 512\napi-key: from-file\n"
    )
    opts = parse(["--config", str(cfg)])
    assert (opts.host, opts.port, opts.uvicorn_log_level) == ("127.0.0.1", 6379, "warning")
    assert opts.enable_prefix_caching is False and opts.max_model_len == 512
    assert opts.api_key == "from-file"
    opts = parse(
        [
            "mymodel",
            "--config",
            str(cfg),
            "--port",
            "9000",
            "--enable-prefix-caching",
            "--api-key",
            "from-flag",
        ]
    )
    assert (opts.model, opts.port, opts.host) == ("mymodel", 9000, "127.0.0.1")
    assert opts.enable_prefix_caching is True and opts.api_key == "from-flag"


def test_api_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(serve.API_KEY_ENV, "secret")
    assert parse([]).api_key == "secret"


def test_bad_config_key_is_reported(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("prot: 8000\n")
    with pytest.raises(CLIError, match="argument --config: .*unknown key 'prot'"):
        parse(["--config", str(cfg)])


def test_chat_template_file_or_inline(tmp_path: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = tmp_path / "t.jinja"
    path.write_text(template)
    assert parse(["--chat-template", str(path)]).chat_template == template
    assert parse(["--chat-template", template]).chat_template == template
    with pytest.raises(CLIError, match="--chat-template: .*neither a file nor a Jinja template"):
        parse(["--chat-template", str(tmp_path / "missing.jinja")])


def test_every_flag_has_help() -> None:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    for action in parser._actions:
        assert action.help, f"{action.dest} has no help text"
    assert {a.dest for a in parser._actions} >= set(serve.DEFAULTS)


def test_kv_cache_dtype_reaches_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse([]).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parse(["--kv-cache-dtype", "int4"])
    given = engine_kwargs(monkeypatch, ["--kv-cache-dtype", "fp8_e5m2", "--port", "1"])
    assert given["kv_cache_dtype"] == "fp8_e5m2" and "port" not in given


def test_serve_has_the_engine_flags_of_generate() -> None:
    opts = parse(GENERATE_FLAGS)
    assert (opts.tokenizer, opts.preemption_mode, opts.swap_space) == ("tok", "swap", 1.5)
    assert opts.enforce_eager is True
    opts = parse([])
    assert (opts.tokenizer, opts.preemption_mode, opts.swap_space) == (None, "recompute", 4.0)
    assert opts.enforce_eager is False


def test_serve_engine_flags_reach_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    given = engine_kwargs(monkeypatch, GENERATE_FLAGS)
    assert given["tokenizer"] == "tok"
    assert (given.get("preemption_mode"), given.get("swap_space")) == ("swap", 1.5)
    assert given.get("enforce_eager") is True


@pytest.mark.parametrize(
    ("env", "level"), [("WARNING", "WARNING"), ("debug", "DEBUG"), ("loud", "INFO"), (None, "INFO")]
)
def test_logging_level_from_environment(env, level, monkeypatch: pytest.MonkeyPatch) -> None:
    """serve logs at PAGEDKV_LOGGING_LEVEL (vLLM: VLLM_LOGGING_LEVEL); an unknown name or none:
    INFO. The server itself is not started."""
    import logging

    from pagedkv.entrypoints.openai import api_server

    if env is None:
        monkeypatch.delenv("PAGEDKV_LOGGING_LEVEL", raising=False)
    else:
        monkeypatch.setenv("PAGEDKV_LOGGING_LEVEL", env)
    seen: dict = {}
    monkeypatch.setattr(logging, "basicConfig", lambda **kw: seen.update(kw))
    monkeypatch.setattr(api_server, "run_server", lambda opts: 0)
    assert serve.run(parse(["--device", "cpu"])) == 0
    assert seen["level"] == level


def test_vllm_flags_that_change_nothing_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM command lines run unchanged: --trust-remote-code, parallel sizes,
    --disable-log-stats; a parallel size of 0 is an argparse error naming the flag."""
    argv = [
        "--trust-remote-code",
        "--tensor-parallel-size",
        "1",
        "--pipeline-parallel-size",
        "1",
        "--disable-log-stats",
        "--scheduling-policy",
        "priority",
    ]
    given = engine_kwargs(monkeypatch, argv)
    assert given["trust_remote_code"] is True and given["disable_log_stats"] is True
    assert given["tensor_parallel_size"] == 1 and given["scheduling_policy"] == "priority"
    assert parse([]).scheduling_policy == "fcfs"
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size"):
        assert vars(parse([flag, "2"]))[flag[2:].replace("-", "_")] == 2
        with pytest.raises(SystemExit):
            parse([flag, "0"])


def test_server_flags_of_vllm(tmp_path: Path) -> None:
    opts = parse([])
    assert (opts.allowed_origins, opts.allowed_methods, opts.allowed_headers) == (["*"],) * 3
    assert opts.allow_credentials is False and opts.enable_request_id_headers is False
    assert (opts.response_role, opts.root_path) == ("assistant", None)
    opts = parse(
        [
            "--allowed-origins",
            '["https://ui.example"]',
            "--allow-credentials",
            "--enable-request-id-headers",
            "--disable-uvicorn-access-log",
            "--root-path",
            "/llm",
            "--response-role",
            "bot",
            "--enable-log-requests",
            "--max-log-len",
            "100",
        ]
    )
    assert opts.allowed_origins == ["https://ui.example"] and opts.allow_credentials
    assert opts.enable_request_id_headers and opts.disable_uvicorn_access_log
    assert (opts.root_path, opts.response_role) == ("/llm", "bot")
    with pytest.raises(SystemExit):
        parse(["--allowed-origins", "https://ui.example"])  # not a JSON list
    cfg = tmp_path / "cors.yaml"
    cfg.write_text("allowed-origins: [https://a.example, https://b.example]\n")
    assert parse(["--config", str(cfg)]).allowed_origins == [
        "https://a.example",
        "https://b.example",
    ]
    cfg.write_text("allowed-origins: [1, 2]\n")
    with pytest.raises(CLIError, match="allowed-origins"):
        parse(["--config", str(cfg)])


def test_cors_and_request_id_header_settings_reach_the_app() -> None:
    """build_app honours the CORS lists and --enable-request-id-headers (no model: a stub
    engine; only routes that do not generate are called)."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    tok = SimpleNamespace(get_vocab=lambda: {"a": 0})
    engine = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=64, vocab_size=1, model="m", name="m"),
        tokenizer=tok,
        is_dead=False,
        get_stats=dict,
    )
    args = parse(["--allowed-origins", '["https://ui.example"]', "--enable-request-id-headers"])
    client = TestClient(build_app(engine, args))
    r = client.get("/v1/models", headers={"Origin": "https://ui.example"})
    assert r.headers["access-control-allow-origin"] == "https://ui.example"
    assert r.headers["x-request-id"]
    r = client.get("/v1/models", headers={"Origin": "https://evil.example", "X-Request-Id": "r1"})
    assert "access-control-allow-origin" not in r.headers and r.headers["x-request-id"] == "r1"


def test_root_path_keeps_the_api_key() -> None:
    """With --root-path, uvicorn hands the app "/prefix/v1/..." paths: the key is still
    required on them (the middleware looked at the raw path and let them through)."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    tok = SimpleNamespace(get_vocab=lambda: {"a": 0})
    engine = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=64, vocab_size=1, model="m", name="m"),
        tokenizer=tok,
        is_dead=False,
        get_stats=dict,
    )
    app = build_app(engine, parse(["--root-path", "/llm", "--api-key", "k"]))
    # The paths uvicorn makes with root_path "/llm" (it puts the prefix in front).
    client = TestClient(app, root_path="/llm")
    assert client.get("/llm/v1/models").status_code == 401
    key = {"Authorization": "Bearer k"}
    assert client.get("/llm/v1/models", headers=key).status_code == 200
    assert client.get("/llm/health").status_code == 200


@pytest.mark.parametrize(
    ("text", "value"), [("4096", 4096), ("2k", 2000), ("2K", 2048), ("25.6k", 25600), ("1M", 2**20)]
)
def test_token_counts_as_vllm_writes_them(text: str, value: int) -> None:
    assert parse(["--max-model-len", text]).max_model_len == value
    assert parse(["--max-num-batched-tokens", text]).max_num_batched_tokens == value


@pytest.mark.parametrize("text", ["1.5", "0.0005k", "k", "2x", "1"])
def test_bad_token_counts(text: str) -> None:
    with pytest.raises(SystemExit):
        parse(["--max-model-len", text])


def test_ping_answers_like_health() -> None:
    from types import SimpleNamespace

    from fastapi.testclient import TestClient
    from pagedkv.entrypoints.openai.api_server import build_app

    tok = SimpleNamespace(get_vocab=lambda: {"a": 0})
    engine = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=64, vocab_size=1, model="m", name="m"),
        tokenizer=tok,
        is_dead=False,
        get_stats=dict,
    )
    client = TestClient(build_app(engine, parse([])))
    assert client.get("/ping").status_code == 200 and client.post("/ping").status_code == 200
    engine.is_dead, engine.dead_error = True, RuntimeError("boom")
    assert client.get("/ping").status_code == 503
