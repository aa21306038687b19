"""Tool calling for /v1/chat/completions: the request's ``tools`` and ``tool_choice`` checked,
the grammar that enforces ``required`` and named choices, the model's constrained output turned
into OpenAI ``tool_calls``, and tool / assistant tool-call messages of the history prepared for
the chat template.

``tool_choice``: ``none`` (the tools are shown to the template, no call is made), a named
function (the output is that function's arguments, under a JSON-schema grammar of its
parameters), ``required`` (the output is a non-empty JSON array of {name, parameters} objects,
under a grammar over every tool), ``auto`` (the model answers freely; the server's
--tool-call-parser finds calls in its text; needs --enable-auto-tool-choice, else a 400).
"""

from __future__ import annotations

import contextlib
import json
import secrets
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from pagedkv.engine.structured_output import StructuredOutputsParams
from pagedkv.entrypoints.openai.errors import bad_request
from pagedkv.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolParser

# A function whose "parameters" is missing takes an empty JSON object (OpenAI's rule).
_NO_PARAMETERS: Dict[str, Any] = {"type": "object", "properties": {}}


def tool_call_id() -> str:
    return "chatcmpl-tool-" + secrets.token_hex(16)


@dataclass
class ToolChoice:
    """What a request asks of its tools: mode is 'none', 'auto', 'required' or 'named'."""

    tools: List[Dict[str, Any]]  # the function objects, as the template sees them
    mode: str
    name: Optional[str] = None  # of the named function
    parser: Optional[ToolParser] = None  # auto: finds the calls in the text

    @property
    def calls(self) -> bool:
        """The answer is tool calls (not text)."""
        return self.mode in ("required", "named")

    def constraint(self) -> Optional[StructuredOutputsParams]:
        if self.mode == "named":
            return StructuredOutputsParams(json=self._parameters(self.name or ""))
        if self.mode != "required":
            return None
        each = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [f["name"]]},
                    "parameters": f.get("parameters") or _NO_PARAMETERS,
                },
                "required": ["name", "parameters"],
            }
            for f in self.tools
        ]
        return StructuredOutputsParams(
            json={"type": "array", "minItems": 1, "items": {"anyOf": each}}
        )

    def _parameters(self, name: str) -> Dict[str, Any]:
        fn = next(f for f in self.tools if f["name"] == name)
        return fn.get("parameters") or _NO_PARAMETERS

    def parse(self, text: str) -> List[Dict[str, Any]]:
        """The constrained output as OpenAI tool calls ({id, type, function: {name,
        arguments}}); [] when it is cut short (max_tokens) and does not parse."""
        if self.mode == "named":
            return [_call(self.name or "", text)]
        try:
            items = json.loads(text)
        except ValueError:
            return []
        return [
            _call(i["name"], json.dumps(i["parameters"], ensure_ascii=False))
            for i in items
            if isinstance(i, dict) and "name" in i
        ]

    def answer(self, text: str) -> Tuple[Optional[str], List[Dict[str, Any]]]:
        """(content, tool calls) of a finished answer."""
        if self.calls:
            return None, self.parse(text)
        if self.parser is not None:
            found = self.parser.extract(text)
            return found.content, found.calls
        return text, []

    def finish_reason(self, reason: Optional[str], made_calls: bool) -> Optional[str]:
        """OpenAI's: an answer that ends in tool calls the model chose (auto, required) ends
        with "tool_calls"; a named choice keeps "stop" (the caller forced that call)."""
        if reason == "stop" and made_calls and self.mode in ("auto", "required"):
            return "tool_calls"
        return reason


def _call(name: str, arguments: str) -> Dict[str, Any]:
    return {
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def tool_choice_of(req: Any, parser: Optional[str] = None) -> Optional[ToolChoice]:
    """The request's tool choice, or None when it sends no tools (tool_choice none or unset).
    ``parser``: the server's --tool-call-parser when --enable-auto-tool-choice is on."""
    tools, choice = req.tools, req.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    functions = [_function(i, t) for i, t in enumerate(tools)]
    if choice == "none":
        return ToolChoice(functions, "none")
    if choice == "required":
        return ToolChoice(functions, "required")
    if choice is None or choice == "auto":  # OpenAI's default when tools are given
        if parser is None:
            raise bad_request(
                'tool_choice "auto" (the default when tools are given) needs the '
                "server started with --enable-auto-tool-choice and "
                '--tool-call-parser; or set tool_choice to "none", "required" or '
                "a named function",
                param="tool_choice",
            )
        return ToolChoice(functions, "auto", parser=TOOL_PARSERS[parser]())
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("function"), dict)
    ):
        name = choice["function"].get("name")
        if name not in {f["name"] for f in functions}:
            raise bad_request(
                f"tool_choice names function {name!r}, which is not in tools", param="tool_choice"
            )
        return ToolChoice(functions, "named", name)
    raise bad_request(
        'tool_choice must be "none", "auto", "required" or {"type": "function", '
        '"function": {"name": ...}}',
        param="tool_choice",
    )


def _function(i: int, tool: Any) -> Dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not (
        isinstance(tool, dict)
        and tool.get("type") == "function"
        and isinstance(fn, dict)
        and isinstance(fn.get("name"), str)
        and fn["name"]
    ):
        raise bad_request(
            f"tools[{i}] must be {{'type': 'function', 'function': {{'name': "
            "..., 'parameters': {...}}}}",
            param=f"tools.{i}",
        )
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise bad_request(
            f"tools[{i}].function.parameters must be a JSON schema object", param=f"tools.{i}"
        )
    return fn


def history_fields(message: Any) -> Dict[str, Any]:
    """The tool fields of one history message for the chat template: an assistant's
    tool_calls (arguments as a dict, as HF templates expect) and a tool message's
    tool_call_id."""
    extra = message.model_extra or {}
    out: Dict[str, Any] = {}
    calls = extra.get("tool_calls")
    if calls:
        shown = []
        for call in calls:
            fn = dict(call.get("function") or {}) if isinstance(call, dict) else {}
            args = fn.get("arguments")
            if isinstance(args, str):
                with contextlib.suppress(ValueError):  # else the template shows it as given
                    fn["arguments"] = json.loads(args)
            shown.append({**call, "function": fn})
        out["tool_calls"] = shown
    if extra.get("tool_call_id") is not None:
        out["tool_call_id"] = extra["tool_call_id"]
    return out
