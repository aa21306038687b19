"""argparse value checks for the CLI: each rejects a bad value with a message that argparse
prints as ``error: argument --flag: <message>`` (exit code 2), before any model is loaded.

Also :class:`CLIError` (a bad flag found after parsing, reported the same way by ``cli.main``)
and :class:`HelpFormatter`, which states each flag's default exactly once.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

# vLLM's --dtype choices; the loader also takes fp32 / fp16 / bf16, kept as quiet aliases.
DTYPE_CHOICES = ("auto", "half", "float16", "bfloat16", "float", "float32")
_DTYPE_ALIASES = ("fp32", "fp16", "bf16")


class CLIError(Exception):
    """A flag value found bad after parsing; ``cli.main`` prints it as argparse would."""

    def __init__(self, flag: Optional[str], message: str) -> None:
        super().__init__(f"argument {flag}: {message}" if flag else message)
        self.flag = flag


def _bad(message: str, text: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{message}, got {text!r}")


def int_at_least(lo: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            raise _bad(f"must be an integer >= {lo}", text) from None
        if value < lo:
            raise _bad(f"must be an integer >= {lo}", text)
        return value

    parse.__name__ = f"integer >= {lo}"
    return parse


# vLLM's human-readable token counts: lowercase multipliers are decimal, uppercase binary.
_MULTIPLIERS = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def token_count_at_least(lo: int) -> Callable[[str], int]:
    """An integer >= ``lo`` written as vLLM takes --max-model-len: '4096', '32k' (32000),
    '32K' (32768), '25.6k' (25600). A fraction that does not come out whole is refused."""

    def parse(text: str) -> int:
        body = str(text).strip()
        scale = _MULTIPLIERS.get(body[-1:], 1)
        try:
            if scale == 1:
                value = int(body)
            else:
                number = float(body[:-1]) * scale
                if not number.is_integer():
                    raise ValueError
                value = int(number)
        except (TypeError, ValueError, OverflowError):
            raise _bad(
                f"must be an integer >= {lo} (or like 32k = 32000, 32K = 32768)", text
            ) from None
        if value < lo:
            raise _bad(f"must be an integer >= {lo} (or like 32k = 32000, 32K = 32768)", text)
        return value

    parse.__name__ = f"integer >= {lo}"
    return parse


def float_in(
    lo: Optional[float] = None,
    hi: Optional[float] = None,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Callable[[str], float]:
    """A float in an interval; ``lo_open`` / ``hi_open`` exclude that end."""
    if lo is not None and hi is not None:
        what = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    elif lo is not None:
        what = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        what = f"{'<' if hi_open else '<='} {hi:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise _bad(f"must be a number {what}", text) from None
        ok = value == value  # not NaN
        if lo is not None:
            ok = ok and (value > lo if lo_open else value >= lo)
        if hi is not None:
            ok = ok and (value < hi if hi_open else value <= hi)
        if not ok:
            raise _bad(f"must be a number {what}", text)
        return value

    parse.__name__ = f"number {what}"
    return parse


def power_of_two(hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except (TypeError, ValueError):
            value = 0
        if value < 1 or value > hi or value & (value - 1):
            raise _bad(f"must be a power of two in [1, {hi}]", text)
        return value

    parse.__name__ = "power of two"
    return parse


def existing_dir(text: str) -> str:
    """An existing directory, as its absolute path with symlinks resolved."""
    import os

    if not os.path.isdir(text):
        raise _bad("must be an existing directory", text)
    return os.path.realpath(text)


def port(text: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise _bad("must be a TCP port number in [1, 65535]", text) from None
    if not 1 <= value <= 65535:
        raise _bad("must be a TCP port number in [1, 65535]", text)
    return value


def device(text: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise _bad("must be 'auto', 'cpu', 'cuda' or 'cuda:N'", text)
    return text


def dtype(text: str) -> str:
    if text not in DTYPE_CHOICES + _DTYPE_ALIASES:
        raise _bad(f"must be one of {', '.join(DTYPE_CHOICES)}", text)
    return text


def choice_of(choices: Sequence[str]) -> Callable[[str], str]:
    """Like ``choices=`` but usable on config-file values too (same message)."""

    def parse(text: str) -> str:
        if text not in choices:
            raise _bad(f"must be one of {', '.join(choices)}", text)
        return text

    parse.__name__ = "choice"
    return parse


def json_list(text: Union[str, List[Any]]) -> List[str]:
    """vLLM's list flags (``--allowed-origins '["https://a.example"]'``): a JSON list of
    strings; a config file may give a YAML list instead (``takes_list``)."""
    value: Any = text
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            raise _bad("must be a JSON list of strings, e.g. '[\"*\"]'", text) from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("must be a JSON list of strings, e.g. '[\"*\"]'", str(text))
    return value


json_list.__name__ = "JSON list"
json_list.takes_list = True  # type: ignore[attr-defined]


def json_object(text: Union[str, Dict[str, Any]]) -> Dict[str, Any]:
    """vLLM's dict flags (``--hf-overrides '{"max_position_embeddings": 4096}'``): a JSON
    object; a config file may give a YAML mapping instead."""
    value: Any = text
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except ValueError:
            raise _bad(
                "must be a JSON object ('{...}'; --help shows this flag's keys)", text
            ) from None
    if not isinstance(value, dict):
        raise _bad("must be a JSON object ('{...}'; --help shows this flag's keys)", str(text))
    return value


json_object.__name__ = "JSON object"


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to a value flag's help unless the help already states its
    default (``ArgumentDefaultsHelpFormatter`` appended a second one, and ``None`` / ``True``
    defaults that read wrong). Flags that take no value (switches) state nothing themselves."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "(default" in text
            or action.nargs == 0
            or action.default is None
            or action.default is argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return text + " (default: %(default)s)"
