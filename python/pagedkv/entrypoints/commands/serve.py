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

from pagedkv.entrypoints.engine_args import KV_CACHE_DTYPE_CHOICES, KV_CACHE_DTYPE_HELP

NAME = "serve"
HELP = "Start the OpenAI-compatible API server (like `vllm serve`)."

API_KEY_ENV = "PAGEDKV_API_KEY"

# dest -> default. The only place defaults live; help strings quote them.
DEFAULTS: Dict[str, Any] = {
    "model": None, "host": "0.0.0.0", "port": 8000, "api_key": None,
    "served_model_name": None, "max_model_len": None, "chat_template": None,
    "device": "auto", "dtype": "auto", "block_size": 16, "gpu_memory_utilization": 0.9,
    "kv_cache_space": None, "kv_cache_dtype": "auto", "max_num_seqs": 256,
    "max_num_batched_tokens": None,
    "enable_prefix_caching": True, "enable_chunked_prefill": True, "seed": 0,
    "uvicorn_log_level": "info", "disable_log_requests": False,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    s = argparse.SUPPRESS
    a = parser.add_argument
    a("model", nargs="?", default=s, metavar="MODEL",
      help="model to serve: a GGUF file, a Hugging Face folder, or 'smollm2' "
           "(default: the bundled SmolLM2-135M-Instruct)")
    a("--model", dest="model", default=s, help="same as the positional MODEL")
    a("--config", default=None, help="YAML file of flag values (keys as the flag names)")
    a("--host", default=s, help="address to bind (default: 0.0.0.0, all interfaces)")
    a("--port", type=int, default=s, help="TCP port (default: 8000)")
    a("--api-key", default=s,
      help=f"require 'Authorization: Bearer <key>' on /v1 routes (default: ${API_KEY_ENV})")
    a("--served-model-name", nargs="+", default=s,
      help="name(s) clients use in the 'model' field; the first is reported "
           "(default: the MODEL argument or the model's own name)")
    a("--max-model-len", type=int, default=s,
      help="context length: prompt + completion tokens (default: the model's)")
    a("--chat-template", default=s,
      help="Jinja chat template, as a file path or inline (default: the model's)")
    a("--device", default=s, help="'cpu', 'cuda', 'cuda:N' or 'auto' (default: auto)")
    a("--dtype", default=s, help="'auto', 'float32', 'float16' or 'bfloat16' (default: auto)")
    a("--block-size", type=int, default=s, help="tokens per KV-cache block (default: 16)")
    a("--gpu-memory-utilization", type=float, default=s,
      help="fraction of GPU memory the engine may use, KV cache included (default: 0.9)")
    a("--kv-cache-space", type=float, default=s,
      help="KV-cache size in GiB; overrides --gpu-memory-utilization (default: engine's choice)")
    a("--kv-cache-dtype", choices=KV_CACHE_DTYPE_CHOICES, default=s,
      help=KV_CACHE_DTYPE_HELP + " (default: auto)")
    a("--max-num-seqs", type=int, default=s,
      help="most sequences in one batch (default: 256)")
    a("--max-num-batched-tokens", type=int, default=s,
      help="token budget of one engine step (default: engine's choice)")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=s,
      help="reuse KV blocks of shared prompt prefixes (default: on)")
    a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=s,
      help="split long prefills across steps, batched with decodes (default: on)")
    a("--seed", type=int, default=s, help="random seed of the engine (default: 0)")
    a("--uvicorn-log-level", default=s,
      choices=["critical", "error", "warning", "info", "debug", "trace"],
      help="uvicorn's log level (default: info)")
    a("--disable-log-requests", action="store_true", default=s,
      help="do not log a line per request (default: log them)")


def load_config(path: str) -> Dict[str, Any]:
    import yaml

    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise SystemExit(f"--config {path}: expected a mapping of flag names to values")
    result = {}
    for key, value in data.items():
        dest = str(key).replace("-", "_")
        if dest not in DEFAULTS:
            raise SystemExit(f"--config {path}: unknown key {key!r}")
        result[dest] = value
    return result


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """defaults < $PAGEDKV_API_KEY < config file < command line."""
    merged = dict(DEFAULTS)
    if os.environ.get(API_KEY_ENV):
        merged["api_key"] = os.environ[API_KEY_ENV]
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
    raise SystemExit(f"--chat-template: {value!r} is neither a file nor a Jinja template")


def run(args: argparse.Namespace) -> int:
    opts = resolve(args)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(levelname)s %(asctime)s %(name)s: %(message)s",
                        datefmt="%m-%d %H:%M:%S")
    if opts.disable_log_requests:
        logging.getLogger("pagedkv.server").setLevel(logging.WARNING)
    from pagedkv.entrypoints.openai.api_server import run_server

    return run_server(opts)
