"""The pooling routes: OpenAI's POST /v1/embeddings, vLLM's /pooling, /classify, /score
(+ /v1/score) and /rerank (+ /v1/rerank, /v2/rerank: Jina / Cohere style).

They run on a PoolingEngine (engine/pooling_engine.py) through the same checks as generation
(the engine's input processor, in the tokenizer thread). A server of a generative model answers
them with a 400 naming the task it serves; a pooling server answers /v1/completions and
/v1/chat/completions likewise (``refuse_generation``).
"""

from __future__ import annotations

import base64
import logging
import sys
import time
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pagedkv.engine.llm_pooling import pair_prompt
from pagedkv.engine.pooling_params import PoolingParams
from pagedkv.entrypoints.openai.errors import APIError, bad_request
from pagedkv.entrypoints.openai.protocol_pooling import (
    ClassificationRequest,
    EmbeddingRequest,
    PoolingRequest,
    RerankRequest,
    ScoreRequest,
)
from pagedkv.entrypoints.openai.serving_engine import OpenAIServing, ServerState
from pagedkv.entrypoints.openai.streaming import cancel_on_disconnect

logger = logging.getLogger("pagedkv.server")

# Token ids, and the text (None when given as ids) or a text pair's prompt dict (with its
# token_type_ids: the engine's input processor reads them from there).
Prompt = Tuple[List[int], Union[str, Dict[str, Any], None]]
# The request fields each route reads (others are logged as ignored).
# vLLM's embed_dtype names -> torch dtypes; its endianness names.
EMBED_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
ENDIANNESS = ("native", "big", "little")
_ENCODING_FIELDS = ("encoding_format", "embed_dtype", "endianness")
_COMMON = {"model", "truncate_prompt_tokens", "add_special_tokens", "priority", "request_id"}


def pooling_engine(state: ServerState) -> Any:
    """The served PoolingEngine, or None for a generative model."""
    from pagedkv.engine.pooling_engine import PoolingEngine

    inner = getattr(state.engine, "engine", state.engine)
    return inner if isinstance(inner, PoolingEngine) else None


def refuse_generation(state: ServerState, route: str) -> None:
    """A pooling model's server answers the generation routes with a 400 naming its task."""
    engine = pooling_engine(state)
    if engine is not None:
        raise bad_request(
            f"{route} needs a generative model; this server's model serves the pooling task "
            f"{engine.task!r} ({_ROUTES[engine.task]})"
        )


_ROUTES = {
    "embed": "/v1/embeddings, /pooling, /score, /rerank",
    "classify": "/classify, /pooling, /score, /rerank",
    "score": "/score, /rerank, /classify, /pooling",
    "reward": "/pooling",
}


class OpenAIServingPooling(OpenAIServing):
    def _engine(self, route: str) -> Any:
        engine = pooling_engine(self.state)
        if engine is None:
            raise bad_request(
                f"{route} needs a pooling model; this server's model generates text (task "
                "'generate': /v1/completions, /v1/chat/completions). Serve an embedding or "
                "classification model with --task embed / classify / score (or --runner pooling)"
            )
        return engine

    # ------------------------------------------------------------------ routes
    async def embeddings(self, req: EmbeddingRequest, raw: Request) -> Response:
        self._engine("/v1/embeddings")
        self._start_checks(req, {"input", "dimensions", "normalize", *_ENCODING_FIELDS})
        params = PoolingParams(task="embed", dimensions=req.dimensions, normalize=req.normalize)
        rid, outs, n_tokens = await self._run(req, raw, "embd", await self._inputs(req), params)
        data = [
            {"index": i, "object": "embedding", "embedding": _encode(o.outputs.data, req)}
            for i, o in enumerate(outs)
        ]
        return self._list(rid, data, n_tokens)

    async def pooling(self, req: PoolingRequest, raw: Request) -> Response:
        engine = self._engine("/pooling")
        self._start_checks(
            req,
            {"input", "dimensions", "normalize", "task", "use_activation", *_ENCODING_FIELDS}
            | {"softmax", "activation"},
        )
        task = req.task or engine.task
        act = _activation(req)
        params = PoolingParams(
            task=task, dimensions=req.dimensions, normalize=req.normalize, use_activation=act
        )
        rid, outs, n_tokens = await self._run(req, raw, "pool", await self._inputs(req), params)
        data = [
            {"index": i, "object": "pooling", "data": _encode(o.outputs.data, req)}
            for i, o in enumerate(outs)
        ]
        return self._list(rid, data, n_tokens)

    async def classify(self, req: ClassificationRequest, raw: Request) -> Response:
        engine = self._engine("/classify")
        self._start_checks(req, {"input", "use_activation", "activation", "softmax"})
        params = PoolingParams(task="classify", use_activation=_activation(req))
        rid, outs, n_tokens = await self._run(req, raw, "classify", await self._inputs(req), params)
        labels = engine.pooler.id2label
        data = []
        for i, o in enumerate(outs):
            probs = o.outputs.data.tolist()
            best = int(np.argmax(probs))
            data.append(
                {
                    "index": i,
                    "label": labels.get(best, f"LABEL_{best}"),
                    "probs": probs,
                    "num_classes": len(probs),
                }
            )
        return self._list(rid, data, n_tokens)

    async def score(self, req: ScoreRequest, raw: Request) -> Response:
        self._engine("/score")
        self._start_checks(req, {"text_1", "text_2", "use_activation", "activation"})
        left = [req.text_1] if isinstance(req.text_1, str) else list(req.text_1)
        right = [req.text_2] if isinstance(req.text_2, str) else list(req.text_2)
        if not left or not right:
            raise bad_request("text_1 and text_2 must not be empty", param="text_1")
        if len(left) == 1:
            left = left * len(right)
        if len(left) != len(right):
            raise bad_request(
                f"text_1 has {len(left)} items and text_2 {len(right)}; give one text_1 or as "
                "many as text_2",
                param="text_1",
            )
        rid, scores, n_tokens = await self._scores(req, raw, "score", left, right)
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
        return self._list(rid, data, n_tokens)

    async def rerank(self, req: RerankRequest, raw: Request) -> Response:
        self._engine("/rerank")
        self._start_checks(req, {"query", "documents", "top_n", "return_documents"})
        docs = [_document_text(d, i) for i, d in enumerate(req.documents)]
        if not docs:
            raise bad_request("documents must not be empty", param="documents")
        if req.top_n is not None and req.top_n < 0:
            raise bad_request(f"top_n must be >= 0, got {req.top_n}", param="top_n")
        queries = [req.query] * len(docs)
        rid, scores, n_tokens = await self._scores(req, raw, "rerank", queries, docs)
        order = sorted(range(len(docs)), key=lambda i: -scores[i])
        if req.top_n:  # vLLM: 0 or none means every document
            order = order[: req.top_n]
        results = []
        for i in order:
            item: Dict[str, Any] = {"index": i, "relevance_score": scores[i]}
            if req.return_documents:
                item["document"] = {"text": docs[i]}
            results.append(item)
        return JSONResponse(
            {
                "id": rid,
                "model": self.state.model_name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
                "results": results,
            }
        )

    # ------------------------------------------------------------------ shared work
    def _start_checks(self, req: Any, handled: set) -> None:
        self.check_model(req.model)
        ignored = sorted(set(req.model_extra or ()) - handled - _COMMON)
        if ignored:
            logger.warning(
                "The following fields were present in the request but ignored: %s",
                ", ".join(ignored),
            )
        encoding = getattr(req, "encoding_format", "float")
        if encoding not in ("float", "base64"):
            raise bad_request(
                f"encoding_format must be 'float' or 'base64', got {encoding!r}",
                param="encoding_format",
            )
        for name, allowed in (("embed_dtype", EMBED_DTYPES), ("endianness", ENDIANNESS)):
            value = getattr(req, name, None)
            if value is not None and value not in allowed:
                raise bad_request(
                    f"{name} must be one of {sorted(allowed)}, got {value!r}", param=name
                )

    def _keep_last(self, req: Any) -> Optional[int]:
        """truncate_prompt_tokens, within max_model_len (the engine cuts to what a pooling
        prompt may hold)."""
        keep = self.truncation(req)
        return None if keep is None else min(keep, self.state.max_model_len)

    async def _inputs(self, req: Any) -> List[Prompt]:
        """OpenAI's `input`: text, texts, token ids or lists of token ids."""
        given = req.input
        if isinstance(given, str):
            items: List[Any] = [given]
        elif not given:
            raise bad_request("input must not be empty", param="input")
        elif all(isinstance(t, int) for t in given):
            items = [list(given)]
        else:
            items = list(given)
        keep = self._keep_last(req)
        out: List[Prompt] = []
        for item in items:
            if isinstance(item, str):
                ids = await self.encode_async(item, req.add_special_tokens, "input", keep)
                out.append((ids, item if keep is None else None))
            else:
                ids = list(item)[-keep:] if keep else list(item)
                if not ids:
                    raise bad_request("input must not hold an empty token list", param="input")
                self.check_ids(ids, "input")
                out.append((ids, None))
        return out

    async def _pairs(self, req: Any, left: List[str], right: List[str]) -> List[Prompt]:
        """A cross-encoder's inputs: the tokenizer's text pairs (ids and token types cut
        alike by truncate_prompt_tokens)."""
        tok = self.engine.tokenizer
        keep = self._keep_last(req)
        out: List[Prompt] = []
        for a, b in zip(left, right):
            self.check_length(len(a) + len(b), "text_2")
            try:
                pair = await self.in_tokenizer_thread(
                    pair_prompt, tok, a, b, req.add_special_tokens
                )
            except ValueError as exc:
                raise bad_request(str(exc), param="text_2") from None
            if keep:
                pair = {k: v[-keep:] for k, v in pair.items()}
            ids = pair["prompt_token_ids"]
            out.append((ids, pair if "token_type_ids" in pair else None))
        return out

    async def _scores(
        self, req: Any, raw: Request, prefix: str, left: List[str], right: List[str]
    ) -> Tuple[str, List[float], int]:
        """One score per pair: a cross-encoder's, or the cosine of two embeddings."""
        engine = self._engine("/score")
        act = getattr(req, "use_activation", None)
        if act is None:
            act = getattr(req, "activation", None)
        if engine.pooler.is_classifier:
            params = PoolingParams(task="score", use_activation=act)
            pairs = await self._pairs(req, left, right)
            rid, outs, n = await self._run(req, raw, prefix, pairs, params)
            return rid, [float(o.outputs.data.reshape(-1)[0]) for o in outs], n
        if act is not None:
            raise bad_request("use_activation applies to cross-encoders", param="use_activation")
        texts = list(dict.fromkeys(left + right))  # each distinct text embedded once
        keep = self._keep_last(req)
        prompts: List[Prompt] = [
            (await self.encode_async(t, req.add_special_tokens, "text_1", keep), None)
            for t in texts
        ]
        rid, outs, n = await self._run(req, raw, prefix, prompts, PoolingParams(task="embed"))
        vec = {t: o.outputs.data.float() for t, o in zip(texts, outs)}
        scores = [float(F.cosine_similarity(vec[a], vec[b], dim=0)) for a, b in zip(left, right)]
        return rid, scores, n

    async def _run(
        self, req: Any, raw: Request, prefix: str, prompts: List[Prompt], params: PoolingParams
    ) -> Tuple[str, List[Any], int]:
        request_id, engine_id = self.request_ids(raw, req, prefix)
        jobs = [(ids, text, params) for ids, text in prompts]
        logger.info(
            "request %s: %s prompt_tokens=%s", request_id, params.task, [len(p[0]) for p in prompts]
        )
        streams = await self.start_all(engine_id, jobs, req.priority, "input", req.model)

        async def finals() -> List[Any]:
            try:
                results = []
                for stream in streams:
                    last = None
                    async for out in stream:
                        last = out  # a pooling request has one output: its final one
                    results.append(last)
                return results
            finally:
                for s in streams:
                    s.close()

        outs = await cancel_on_disconnect(raw, finals())
        if outs is None:
            raise APIError(499, "client disconnected")
        return request_id, outs, sum(len(p[0]) for p in prompts)

    def _list(self, request_id: str, data: List[Dict[str, Any]], n_tokens: int) -> JSONResponse:
        return JSONResponse(
            {
                "id": request_id,
                "object": "list",
                "created": int(time.time()),
                "model": self.state.model_name,
                "data": data,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
        )


def _activation(req: Any) -> Optional[bool]:
    for name in ("use_activation", "activation", "softmax"):
        value = getattr(req, name, None)
        if value is not None:
            return bool(value)
    return None


def _encode(data: Any, req: Any) -> Any:
    """float: nested lists; base64: the flattened values' bytes as vLLM sends them, in
    ``embed_dtype`` (float32 by default, as OpenAI's client reads them) and ``endianness``
    (native: the server's byte order)."""
    if getattr(req, "encoding_format", "float") != "base64":
        return data.tolist()
    values = data.detach().to(EMBED_DTYPES[req.embed_dtype]).flatten().contiguous()
    raw = values.view(torch.uint8).numpy()  # the host's byte order
    order = sys.byteorder if req.endianness == "native" else req.endianness
    if order != sys.byteorder and values.element_size() > 1:
        raw = raw.reshape(-1, values.element_size())[:, ::-1]
    return base64.b64encode(np.ascontiguousarray(raw).tobytes()).decode("ascii")


def _document_text(doc: Any, i: int) -> str:
    if isinstance(doc, str):
        return doc
    text = doc.get("text") if isinstance(doc, dict) else None
    if not isinstance(text, str):
        raise bad_request(
            f"documents[{i}] must be a string or an object with a 'text' string",
            param="documents",
        )
    return text


def add_pooling_routes(app: FastAPI, state: ServerState) -> None:
    serving = OpenAIServingPooling(state)

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest, raw: Request) -> Response:
        return await serving.embeddings(req, raw)

    @app.post("/pooling")
    async def pooling(req: PoolingRequest, raw: Request) -> Response:
        return await serving.pooling(req, raw)

    @app.post("/classify")
    async def classify(req: ClassificationRequest, raw: Request) -> Response:
        return await serving.classify(req, raw)

    async def score(req: ScoreRequest, raw: Request) -> Response:
        return await serving.score(req, raw)

    async def rerank(req: RerankRequest, raw: Request) -> Response:
        return await serving.rerank(req, raw)

    # One OpenAPI operation id per path (the fuzzer reads them).
    for handler, paths in ((score, ("/score", "/v1/score")), (rerank, _RERANK_PATHS)):
        for path in paths:
            op = path.strip("/").replace("/", "_")
            app.add_api_route(path, handler, methods=["POST"], operation_id=op)


_RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
