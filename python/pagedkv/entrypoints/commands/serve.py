"""``pagedkv serve [MODEL]``: the OpenAI-compatible server, with vLLM's flag spelling.

Every flag can also come from ``--config file.yaml`` (same names, dashes or underscores, e.g.
``port: 8000`` or ``uvicorn-log-level: info``); flags given on the command line win over the
file, which wins over the defaults. Flags default to ``argparse.SUPPRESS`` so that ``run`` can
tell "given" from "defaulted".
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Dict

from pagedkv import envs
from pagedkv.entrypoints import arg_types as t
from pagedkv.entrypoints.arg_types import CLIError
from pagedkv.entrypoints.engine_args import ENGINE_DEFAULTS, add_engine_arguments
from pagedkv.entrypoints.openai.limits import LIMIT_DEFAULTS

NAME = "serve"
HELP = "Start the OpenAI-compatible API server (like `vllm serve`)."

API_KEY_ENV = "PAGEDKV_API_KEY"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# dest -> default. The only place the server's own defaults live; help strings quote them. The
# engine flags' defaults come from their shared definitions (engine_args.ENGINE_FLAGS).
DEFAULTS: Dict[str, Any] = {
    "host": "0.0.0.0",
    "port": 8000,
    "api_key": None,
    "served_model_name": None,
    "chat_template": None,
    "uvicorn_log_level": "info",
    "disable_log_requests": False,
    "allowed_origins": ["*"],
    "allowed_methods": ["*"],
    "allowed_headers": ["*"],
    "allow_credentials": False,
    "enable_request_id_headers": False,
    "disable_uvicorn_access_log": False,
    "root_path": None,
    "response_role": "assistant",
    "enable_log_requests": False,
    "max_log_len": None,
    "trust_request_chat_template": False,
    "allowed_media_domains": None,
    "shutdown_timeout": 20.0,
    "enable_auto_tool_choice": False,
    "tool_call_parser": None,
    "reasoning_parser": None,
    "lora_modules": None,
    **LIMIT_DEFAULTS,
    **ENGINE_DEFAULTS,
}


def _tool_parser_names() -> list:
    from pagedkv.entrypoints.openai.tool_parsers import TOOL_PARSERS

    return list(TOOL_PARSERS)


def _reasoning_parser_names() -> list:
    from pagedkv.entrypoints.openai.reasoning_parsers import REASONING_PARSERS

    return list(REASONING_PARSERS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    a = parser.add_argument
    a(
        "model",
        nargs="?",
        default=s,
        metavar="MODEL",
        help="model to serve, the same as --model: a GGUF file, a Hugging Face folder, or "
        "'smollm2' (default: the bundled SmolLM2-135M-Instruct)",
    )
    a(
        "--config",
        default=None,
        help="YAML file of flag values, keys as the flag names (e.g. 'port: 8000'); flags "
        "given on the command line win (default: none)",
    )
    g = parser.add_argument_group("server")
    g.add_argument("--host", default=s, help="address to bind (default: 0.0.0.0, all interfaces)")
    g.add_argument("--port", type=t.port, default=s, help="TCP port (default: 8000)")
    g.add_argument(
        "--api-key",
        default=s,
        help="require 'Authorization: Bearer <key>' on /v1 routes "
        f"(default: ${API_KEY_ENV}, else $VLLM_API_KEY, else none)",
    )
    g.add_argument(
        "--served-model-name",
        nargs="+",
        default=s,
        help="name(s) clients use in the 'model' field; the first is reported "
        "(default: the MODEL argument or the model's own name)",
    )
    g.add_argument(
        "--chat-template",
        default=s,
        help="Jinja chat template, as a file path or inline (default: the model's)",
    )
    g.add_argument(
        "--allowed-media-domains",
        nargs="+",
        default=s,
        metavar="HOST",
        help="hosts whose http(s) image_url parts the server may fetch (default: none; "
        "data: URLs are always read)",
    )
    g.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        default=s,
        help="let requests bring their own chat_template (as vLLM, off: a template "
        "is code the server runs, and one can loop for hours)",
    )
    g.add_argument(
        "--uvicorn-log-level",
        default=s,
        type=t.choice_of(LOG_LEVELS),
        metavar="{" + ",".join(LOG_LEVELS) + "}",
        help="uvicorn's log level (default: info)",
    )
    g.add_argument(
        "--disable-log-requests",
        action="store_true",
        default=s,
        help="do not log a line per request",
    )
    g.add_argument(
        "--enable-log-requests",
        action="store_true",
        default=s,
        help="accepted for vLLM compatibility: pagedkv logs a line per request "
        "unless --disable-log-requests",
    )
    g.add_argument(
        "--max-log-len",
        type=t.int_at_least(0),
        default=s,
        help="accepted for vLLM compatibility: the request log lines hold no "
        "prompt text to shorten (default: unlimited)",
    )
    g.add_argument(
        "--disable-uvicorn-access-log",
        action="store_true",
        default=s,
        help="do not log uvicorn's line per HTTP request",
    )
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        default=s,
        help='let chat requests use tool_choice "auto" (needs --tool-call-parser)',
    )
    g.add_argument(
        "--tool-call-parser",
        default=s,
        choices=sorted(_tool_parser_names()),
        help="how tool calls are found in the model's text for tool_choice auto (default: none)",
    )
    g.add_argument(
        "--reasoning-parser",
        default=s,
        choices=sorted(_reasoning_parser_names()),
        help="split chat answers' reasoning (reasoning_content) from their content (default: none)",
    )
    g.add_argument(
        "--response-role",
        default=s,
        help="the role of the chat answers' messages (default: assistant)",
    )
    g.add_argument(
        "--shutdown-timeout",
        type=t.float_in(0.0),
        default=s,
        metavar="SECONDS",
        help="on SIGTERM, how long requests in flight may run before their streams "
        "are ended (new requests get 503 meanwhile); then exit 0 (default: 20.0)",
    )
    g.add_argument(
        "--root-path",
        default=s,
        help="the path prefix of the server behind a path-based proxy, as "
        "FastAPI's root_path (default: none)",
    )
    g.add_argument(
        "--enable-request-id-headers",
        action="store_true",
        default=s,
        help="answer with an X-Request-Id header: the client's, else the request's id",
    )
    # CORS, as vLLM: browsers may call the API from any origin unless restricted here.
    g.add_argument(
        "--allowed-origins",
        type=t.json_list,
        default=s,
        help='CORS: origins allowed, a JSON list (default: ["*"])',
    )
    g.add_argument(
        "--allowed-methods",
        type=t.json_list,
        default=s,
        help='CORS: HTTP methods allowed, a JSON list (default: ["*"])',
    )
    g.add_argument(
        "--allowed-headers",
        type=t.json_list,
        default=s,
        help='CORS: request headers allowed, a JSON list (default: ["*"])',
    )
    g.add_argument(
        "--allow-credentials",
        action="store_true",
        default=s,
        help="CORS: allow credentials (cookies, authorization) in cross-origin calls",
    )
    g.add_argument(
        "--lora-modules",
        nargs="+",
        default=s,
        metavar="NAME=PATH",
        help="LoRA adapters served by name (needs --enable-lora): name=path, or "
        'vLLM\'s JSON form \'{"name": ..., "path": ..., '
        '"base_model_name": ...}\' (default: none)',
    )
    _add_limit_arguments(parser)
    add_engine_arguments(parser, suppress=True)


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request may ask for (limits.py): a request over a limit gets a 400 (413 for
    the body) naming it, instead of slowing every other request down."""
    g = parser.add_argument_group("request limits")
    s, d = argparse.SUPPRESS, LIMIT_DEFAULTS
    g.add_argument(
        "--max-stop-strings",
        type=t.int_at_least(0),
        default=s,
        help=f"most stop strings per request (default: {d['max_stop_strings']})",
    )
    g.add_argument(
        "--max-bad-words",
        type=t.int_at_least(0),
        default=s,
        help=f"most bad_words per request (default: {d['max_bad_words']})",
    )
    g.add_argument(
        "--max-word-chars",
        type=t.int_at_least(1),
        default=s,
        help=f"most characters of one stop string or bad word (default: {d['max_word_chars']})",
    )
    g.add_argument(
        "--max-logit-bias",
        type=t.int_at_least(0),
        default=s,
        help=f"most logit_bias entries per request (default: {d['max_logit_bias']})",
    )
    g.add_argument(
        "--max-request-body-size",
        type=t.int_at_least(1),
        default=s,
        help="most bytes of one request body, on every route (default: "
        f"{d['max_request_body_size']}, 16 MiB)",
    )
    g.add_argument(
        "--max-image-pixels",
        type=t.int_at_least(1),
        default=s,
        help="most pixels (width x height) of one image of a request, checked before it is "
        f"decoded (default: {d['max_image_pixels']}, 4096 x 4096)",
    )


def _config_value(action: argparse.Action, value: Any) -> Any:
    """A config-file value checked (and converted) as the flag's command-line text would be."""
    if action.nargs == 0:  # --x / --no-x and switches take true / false
        if not isinstance(value, bool):
            raise ValueError(f"must be true or false, got {value!r}")
        return value
    if value is None and DEFAULTS.get(action.dest, 0) is None:
        return None
    if action.nargs == "+":
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(v, str) for v in items):
            raise ValueError(f"must be a string or a list of strings, got {value!r}")
        return items
    convert: Any = action.type  # a callable here (argparse types it with FileType and str)
    if isinstance(value, list) and getattr(convert, "takes_list", False):
        try:
            return convert(value)
        except argparse.ArgumentTypeError as e:
            raise ValueError(str(e)) from None
    if isinstance(value, (bool, list, dict)) or value is None:
        raise ValueError(f"must be a single value, got {value!r}")
    if convert is None:
        return str(value)
    try:
        return convert(str(value))
    except argparse.ArgumentTypeError as e:
        raise ValueError(str(e)) from None
    except ValueError:
        raise ValueError(
            f"must be {getattr(convert, '__name__', 'valid')}, got {value!r}"
        ) from None


def load_config(path: str) -> Dict[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise CLIError("--config", f"cannot read {path!r}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise CLIError("--config", f"{path!r} is not valid YAML: {' '.join(str(e).split())}") from e
    if not isinstance(data, dict):
        raise CLIError("--config", f"{path}: expected a mapping of flag names to values")
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    actions = {
        a.dest: a for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS
    }
    result = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in DEFAULTS:
            raise CLIError("--config", f"{path}: unknown key {key!r}")
        try:
            result[dest] = _config_value(actions[dest], value)
        except ValueError as e:
            raise CLIError("--config", f"{path}: key {key!r}: {e}") from e
    return result


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """defaults < $PAGEDKV_API_KEY (else vLLM's $VLLM_API_KEY) < config file < command line."""
    merged = dict(DEFAULTS)
    if envs.getenv(API_KEY_ENV):
        merged["api_key"] = envs.getenv(API_KEY_ENV)
    if getattr(args, "config", None):
        merged.update(load_config(args.config))
    merged.update({k: v for k, v in vars(args).items() if k in DEFAULTS})
    if isinstance(merged["served_model_name"], str):
        merged["served_model_name"] = [merged["served_model_name"]]
    merged["chat_template"] = load_chat_template(merged["chat_template"])
    return argparse.Namespace(**merged)


def load_chat_template(value: Any) -> Any:
    """A file path is read; anything that looks like Jinja is taken inline (as vLLM does)."""
    if not value:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value.encode().decode("unicode_escape") if "\\n" in value else value
    raise CLIError("--chat-template", f"{value!r} is neither a file nor a Jinja template")


def run(args: argparse.Namespace) -> int:
    opts = resolve(args)
    # PAGEDKV_LOGGING_LEVEL (else vLLM's VLLM_LOGGING_LEVEL) sets the level, as for LLM.
    level = (envs.getenv("PAGEDKV_LOGGING_LEVEL") or "INFO").upper()
    if not isinstance(logging.getLevelName(level), int):  # an unknown name: the default
        level = "INFO"
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(levelname)s %(asctime)s %(name)s: %(message)s",
        datefmt="%m-%d %H:%M:%S",
    )
    if opts.disable_log_requests:
        logging.getLogger("pagedkv.server").setLevel(logging.WARNING)
    from pagedkv.entrypoints.engine_args import check_engine_args, engine_error
    from pagedkv.entrypoints.openai.api_server import run_server

    check_engine_args(opts)
    check_lora_modules(opts)
    try:
        return run_server(opts)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        # Raised while the engine is built from the flags (the server itself reports request
        # errors to its clients): named as a flag error where the message names a field.
        mapped = engine_error(e, opts)
        if mapped is None or mapped.flag is None:
            raise
        raise mapped from e


def check_lora_modules(opts: argparse.Namespace) -> None:
    """--lora-modules entries well formed and --enable-lora given, before the model loads (the
    adapters themselves are read once it has)."""
    from pagedkv.entrypoints.openai.serving_lora import parse_lora_module

    modules = opts.lora_modules or []
    if modules and not opts.enable_lora:
        raise CLIError("--lora-modules", "LoRA adapters need --enable-lora")
    for text in modules:
        try:
            parse_lora_module(text)
        except ValueError as e:
            raise CLIError("--lora-modules", str(e).removeprefix("--lora-modules: ")) from None
