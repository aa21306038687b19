"""Pythonic format (Llama 3.2 / 4, ToolACE): the answer is a Python list of calls,
``[get_weather(city="Paris", days=2), get_time()]``, with literal arguments only."""

from __future__ import annotations

import ast

from pagedkv.entrypoints.openai.tool_parsers.abstract_tool_parser import (
    ExtractedToolCalls,
    ToolParser,
    tool_call,
)


class PythonicToolParser(ToolParser):
    def calls_start(self, text: str) -> int | None:
        return 0 if text.lstrip().startswith("[") or not text.strip() else None

    def extract(self, text: str) -> ExtractedToolCalls:
        body = text.strip()
        if not body.startswith("["):
            return ExtractedToolCalls(text)
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List):
                raise ValueError("not a list")
            calls = [self._call(node) for node in tree.elts]
        except (SyntaxError, ValueError):
            return ExtractedToolCalls(text)
        return ExtractedToolCalls(None, calls)

    @staticmethod
    def _call(node: ast.expr) -> dict:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            raise ValueError("each entry must be name(keyword=literal, ...)")
        # literal_eval: values only, never code the model wrote.
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        return tool_call(node.func.id, args)
