"""PoolingEngine: pooling requests (embed, classify, score, reward, encode) through the same C++
scheduler, paged KV cache and model runner as generation, prefill only.

One step: Scheduler.schedule() -> StepPlan -> ModelRunner.execute() -> the final hidden states of
the scheduled prompt tokens; each request keeps the rows its pooler reads (every row for
MEAN / ALL / STEP, gathered across chunked-prefill chunks; the first row for CLS; the last one
for LAST). A request finishes in the step that completes its prompt: it is added to the
scheduler with max_tokens=1 and that step hands the scheduler a placeholder token, which ends it
by length and frees its blocks; no decode step ever runs. The pooler then turns the gathered
rows of the step's finished requests into their outputs, batched.

Prefix caching: a cached prefix has no hidden states. As in vLLM, only requests whose pooler
reads the last token alone (LAST) share cached blocks; any other request gets a cache salt of its
own (it never hits another request's blocks). Encoders (non-causal attention: every token sees
the whole prompt) run with chunked prefill and prefix caching off (pooling_engine_config).

Failures: a request whose own work raises in a step (its input breaks the batched forward, its
rows cannot be gathered, its pooling head raises) fails alone, as in generation
(request_failures.py): a batched forward or head that raises is redone one request at a time,
the requests that raise alone are aborted and reported by take_request_errors, the others get
what a solo run gives them. A device error is nobody's: it fails the step.

Token types: a request may carry token_type_ids (a BERT cross-encoder's text pair, segment B =
1); a step whose requests have any passes the types of its scheduled positions to the model.

The engine offers LLMEngine's interface (add_request, step, abort_request, ...) so that LLM and
AsyncLLMEngine drive it unchanged.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Union, cast

import numpy as np
import torch

from pagedkv.engine.config import EngineConfig
from pagedkv.engine.engine_setup import build_engine_parts
from pagedkv.engine.input_processor import (
    EngineRequest,
    InputProcessor,
    RequestLimits,
    check_request_id,
    check_truncation,
)
from pagedkv.engine.llm_inputs import prompt_item
from pagedkv.engine.micro_batches import plan_part
from pagedkv.engine.plan_arrays import PlanArrays
from pagedkv.engine.pooler import Pooler, PoolerConfig, sentence_transformers_config
from pagedkv.engine.pooling_outputs import PoolingOutput, PoolingRequestOutput
from pagedkv.engine.pooling_params import PoolingParams
from pagedkv.engine.request_failures import FAILED, RequestFailures, try_batch

logger = logging.getLogger("pagedkv")

# The request tasks each engine task serves (score on an embedding model is two embeds and a
# cosine, done by the caller: LLM.score and the server's /score).
SUPPORTED_TASKS = {
    "embed": ("embed", "encode"),
    "classify": ("classify", "score", "reward", "encode"),
    "score": ("score", "classify", "reward", "encode"),
    "reward": ("reward", "encode"),
}


@dataclass
class PoolingEngineRequest(EngineRequest):
    """A checked pooling request (what PoolingEngine.add_request runs as is). An EngineRequest
    so that AsyncLLMEngine and the server pass it through unchanged; ``params`` holds the
    PoolingParams, ``max_tokens`` is 1 (the placeholder token that ends it)."""

    task: str = "embed"
    # Each prompt token's segment (a BERT cross-encoder's text pair: A = 0, B = 1); None: all 0.
    token_type_ids: Optional[List[int]] = None

    @property
    def pooling_params(self) -> PoolingParams:
        return cast(PoolingParams, self.params)


@dataclass
class _Running:
    req: PoolingEngineRequest
    rows: str  # which rows the pooler reads: "first", "last" or "all"
    parts: List[torch.Tensor] = field(default_factory=list)
    covered: int = 0  # prompt positions gathered in ``parts`` ("all")
    num_cached_tokens: Optional[int] = None

    def gather(self, start: int, hidden: torch.Tensor, completes: bool) -> None:
        """The hidden states of prompt positions start .. start + len(hidden) - 1."""
        if self.rows == "first":
            if start == 0:
                self.parts = [hidden[:1].clone()]
        elif self.rows == "last":
            if completes:
                self.parts = [hidden[-1:]]
        else:
            if start < self.covered:  # recomputed after a preemption: drop the stale rows
                kept = torch.cat(self.parts)[:start] if self.parts else None
                self.parts = [kept] if kept is not None and len(kept) else []
                self.covered = start
            if start != self.covered:
                raise RuntimeError(
                    f"request {self.req.request_id!r}: prompt positions {self.covered}..{start} "
                    "were never computed (a prefix-cache hit on a request that reads every row)"
                )
            self.parts.append(hidden.clone())
            self.covered += len(hidden)

    def rows_read(self) -> torch.Tensor:
        return self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts)


class PoolingInputProcessor:
    """Checks and tokenizes pooling requests (the generation InputProcessor's rules for the
    prompt, the pooler's for the parameters)."""

    def __init__(
        self,
        base: InputProcessor,
        pooler: Pooler,
        task: str,
        type_vocab_size: int = 0,
        max_prompt_len: Optional[int] = None,
    ) -> None:
        """``type_vocab_size``: how many token types the model embeds (0: it takes none).
        ``max_prompt_len``: the longest prompt the scheduler takes (its length limit less the
        placeholder token that ends a pooling request; default max_model_len - 1)."""
        self.base, self.pooler, self.task = base, pooler, task
        self.type_vocab_size = type_vocab_size
        self.tokenizer = base.tokenizer
        self.max_model_len = base.max_model_len
        self.room = min(max_prompt_len or self.max_model_len - 1, self.max_model_len)

    def process(
        self,
        request_id: str,
        prompt: Union[str, List[int], Dict[str, Any], None],
        params: Optional[PoolingParams] = None,
        arrival_time: Optional[float] = None,
        *,
        prompt_token_ids: Optional[List[int]] = None,
        priority: Any = 0,
        limits: Optional[RequestLimits] = None,
    ) -> PoolingEngineRequest:
        check_request_id(request_id)
        if params is None:
            params = PoolingParams()
        if not isinstance(params, PoolingParams):
            raise TypeError(
                f"a pooling model takes PoolingParams, got {type(params).__name__} (this engine "
                f"serves task {self.task!r}, not text generation)"
            )
        task = params.task or self.task
        if task not in SUPPORTED_TASKS[self.task]:
            raise ValueError(
                f"task {task!r} is not served by this engine (task {self.task!r}; it serves "
                f"{', '.join(SUPPORTED_TASKS[self.task])})"
            )
        self.pooler.check(task, params)
        priority = self.base.check_priority(priority)
        text, ids, types = self._prompt(prompt, prompt_token_ids, params)
        return PoolingEngineRequest(
            request_id,
            text,
            ids,
            params,  # type: ignore[arg-type]  # (EngineRequest declares SamplingParams)
            1,
            priority,
            arrival_time or time.time(),
            task=task,
            token_type_ids=types,
        )

    def _prompt(
        self, prompt: Any, prompt_token_ids: Optional[List[int]], params: PoolingParams
    ) -> tuple[Optional[str], List[int], Optional[List[int]]]:
        """The prompt's text, token ids and token types (each truncated alike)."""
        types = None
        if prompt is not None and not isinstance(prompt, str):
            item = prompt_item(prompt, "prompt", extra_keys=("token_type_ids",))
            prompt = item.get("prompt")
            if prompt_token_ids is None:
                prompt_token_ids = item.get("prompt_token_ids")
            types = item.get("token_type_ids")
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("prompt or prompt_token_ids must be given")
            prompt_token_ids = self.base.encode_prompt(prompt)
        ids = [int(t) for t in prompt_token_ids]
        if not ids:
            raise ValueError("prompt must not be empty (it encodes to no tokens)")
        if types is not None:
            types = self._token_types(types, len(ids))
        room = self.room
        keep = params.truncate_prompt_tokens
        if keep is not None:
            check_truncation(keep, self.max_model_len)
            ids = ids[-(room if keep == -1 else min(keep, room)) :]
            types = types[-len(ids) :] if types is not None else None
        vocab = self.base.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(
                f"prompt_token_ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}"
            )
        if len(ids) > room:
            raise ValueError(
                f"prompt is {len(ids)} tokens long; a pooling prompt may have at most "
                f"{room} tokens (max_model_len={self.max_model_len}); set "
                "truncate_prompt_tokens to cut it"
            )
        return prompt, ids, types

    def _token_types(self, types: Any, n: int) -> List[int]:
        """A prompt's token_type_ids, checked: one per prompt token, each a type the model
        embeds."""
        if self.type_vocab_size == 0:
            raise ValueError(
                "prompt['token_type_ids']: this model takes no token types (only BERT-style "
                "encoders do)"
            )
        if not isinstance(types, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in types
        ):
            raise TypeError("prompt['token_type_ids'] must be a list of integers")
        if len(types) != n:
            raise ValueError(
                f"prompt['token_type_ids'] has {len(types)} entries for {n} prompt tokens"
            )
        if types and (min(types) < 0 or max(types) >= self.type_vocab_size):
            raise ValueError(
                f"prompt['token_type_ids'] must be in [0, {self.type_vocab_size}), got "
                f"{min(types)}..{max(types)}"
            )
        return list(types)


class PoolingEngine:
    def __init__(self, config: EngineConfig, task: str) -> None:
        if config.world_size > 1:
            raise ValueError(
                "pooling models with tensor or pipeline parallelism are not supported yet"
            )
        if config.enable_lora:
            raise ValueError("enable_lora with a pooling model is not supported yet")
        self.config, self.task = config, task
        parts = build_engine_parts(config, pooling=True)
        self.tokenizer = parts.tokenizer
        self.model_config = parts.model_config
        self.runner, self.scheduler = parts.runner, parts.scheduler
        self.num_gpu_blocks, self.num_cpu_blocks = parts.num_blocks, parts.num_cpu_blocks
        model = self.runner.model
        directory = model.source.directory if model.source.kind == "hf" else None
        pooler_cfg = PoolerConfig.from_dict(config.pooler_config or {}).over(
            sentence_transformers_config(directory)
        )
        self.pooler = Pooler(model, pooler_cfg, directory)
        self.is_causal = bool(getattr(model, "is_causal", True))
        base = InputProcessor(
            self.tokenizer,
            self.model_config.vocab_size,
            self.model_config.max_model_len,
            config.max_logprobs,
            config.scheduling_policy,
        )
        self.input_processor = PoolingInputProcessor(
            base,
            self.pooler,
            task,
            int(getattr(model, "type_vocab_size", 0)),
            self.scheduler.config.max_model_len - 1,
        )
        self.requests: Dict[str, _Running] = {}
        self.stats = {"prompt_tokens": 0, "generation_tokens": 0}
        # The requests that failed alone since take_request_errors last ran.
        self._failures: RequestFailures[PoolingEngineRequest] = RequestFailures()
        logger.info(
            "pooling engine: task %s, %s pooling%s",
            task,
            self.pooler.pooling_type(task if task != "score" else "classify"),
            "" if self.is_causal else " (non-causal model: no chunked prefill, no prefix cache)",
        )

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    # ------------------------------------------------------------------ requests
    def add_request(
        self,
        request_id: str,
        prompt: Union[str, List[int], Dict[str, Any], PoolingEngineRequest, None],
        params: Optional[PoolingParams] = None,
        arrival_time: Optional[float] = None,
        *,
        prompt_token_ids: Optional[List[int]] = None,
        priority: int = 0,
        lora_request: Any = None,
    ) -> None:
        """LLMEngine.add_request's signature with PoolingParams; ``prompt`` may be a
        PoolingEngineRequest already checked by ``self.input_processor``."""
        if lora_request is not None:
            raise ValueError("lora_request with a pooling model is not supported yet")
        if isinstance(prompt, PoolingEngineRequest):
            req = prompt
        else:
            req = self.input_processor.process(
                request_id,
                prompt,
                params,
                arrival_time,
                prompt_token_ids=prompt_token_ids,
                priority=priority,
            )
        if req.request_id != request_id:
            raise ValueError(
                f"request_id {request_id!r} differs from the processed request's {req.request_id!r}"
            )
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        rows = self.pooler.rows(req.task)
        # Only a request that reads its last row alone may start from cached blocks.
        shared = rows == "last" and self.is_causal
        salt = 0 if shared else (zlib.crc32(request_id.encode()) | 1)
        self.scheduler.add_request(
            request_id,
            req.prompt_token_ids,
            1,  # the placeholder token that ends it once the prompt is done
            stop_token_ids=[],
            priority=req.priority,
            ignore_eos=True,
            min_tokens=0,
            cache_salt=salt,
        )
        self.requests[request_id] = _Running(req, rows)

    def abort_request(self, request_id: Union[str, Iterable[str]]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.scheduler.abort_request(rid)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def take_request_errors(self) -> Dict[str, Exception]:
        """The requests that failed alone since the last call, each with its error (LLMEngine's
        hook, read by AsyncLLMEngine after every step): a request whose own forward, rows or
        pooling head raised. Their outputs came with the step, finished, with no data. A step
        that fails for no request's fault (a device error) aborts all of its requests (_fail)
        and raises instead."""
        errors = self._failures.errors()
        for rid, exc in errors.items():
            logger.warning("request %r failed and was aborted: %r", rid, exc)
        self._failures = RequestFailures()
        return errors

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    # ------------------------------------------------------------------ one step
    def step(self) -> List[PoolingRequestOutput]:
        plan = self.scheduler.schedule()
        n = int(plan.num_seqs)
        if n == 0:
            if (
                len(plan.blocks_to_swap_out)
                or len(plan.blocks_to_swap_in)
                or len(plan.blocks_to_copy)
            ):
                self.runner.apply_block_ops(plan)
            return []
        ids = list(plan.request_ids)[:n]
        try:
            completes = np.asarray(plan.sample_indices[:n]) >= 0
            self._gather(plan, ids, completes, self._forward(plan, ids))
        except BaseException:
            self._fail(plan, ids)
            raise
        failed = self._drop_failed(ids)
        finished = self.scheduler.update(plan, np.where(completes, 0, -1).astype(np.int64))
        ids_done = [f.request_id for f in finished]  # (all by length: the placeholder token)
        done = self._finish([self.requests.pop(rid) for rid in ids_done if rid in self.requests])
        return [self._output(run, torch.empty(0)) for run in failed] + done

    def _forward(self, plan: Any, ids: List[Optional[str]]) -> List[Optional[torch.Tensor]]:
        """Each sequence's hidden states [its scheduled tokens, hidden] (None: a dropped
        entry, or a request whose own forward raised). Where the batched forward raises (not
        a device error), each sequence runs alone (plan_part, without the block operations,
        which the batch ran first), so that only a request whose own input breaks the model
        fails; the others get their solo run's states. A plan with block operations (swaps,
        copies) is not redone: whether they ran before the batch raised is unknown, and a
        rerun without them could read stale blocks (its failure fails the step)."""
        types = self._step_token_types(plan, ids)
        qsl = np.asarray(plan.query_start_loc[: len(ids) + 1]).tolist()

        def run(part: Any, part_types: Optional[torch.Tensor]) -> torch.Tensor:
            if part_types is None:
                return self.runner.execute(part)
            return self.runner.execute(part, token_type_ids=part_types)

        block_ops = (plan.blocks_to_swap_out, plan.blocks_to_swap_in, plan.blocks_to_copy)
        has_ops = any(len(ops) for ops in block_ops)
        hidden = run(plan, types) if has_ops else try_batch(lambda: run(plan, types))
        if hidden is not FAILED:
            return [hidden[qsl[i] : qsl[i + 1]] for i in range(len(ids))]
        arrays = PlanArrays.from_plan(plan, self.config.block_size)
        out: List[Optional[torch.Tensor]] = [None] * len(ids)
        for i, rid in enumerate(ids):
            owner = self.requests.get(rid) if rid is not None else None
            if owner is None:
                continue
            lo, hi = qsl[i], qsl[i + 1]
            with self._failures.guard(owner.req):
                part = plan_part(arrays, i, i + 1, first=False)
                out[i] = run(part, None if types is None else types[lo:hi])[: hi - lo]
        return out

    def _drop_failed(self, ids: List[Optional[str]]) -> List[_Running]:
        """The step's requests that failed in it, taken out of the engine and the scheduler
        (before the plan is applied: the scheduler skips the entries aborted since)."""
        failed = []
        for rid in ids:
            run = self.requests.get(rid) if rid is not None else None
            if run is not None and run.req in self._failures:
                failed.append(self.requests.pop(run.req.request_id))
                self.scheduler.abort_request(run.req.request_id)
        return failed

    def _step_token_types(self, plan: Any, ids: List[Optional[str]]) -> Optional[torch.Tensor]:
        """The token types of the step's tokens [num_tokens]: each sequence's scheduled prompt
        positions (from its context length on) read from its request's token_type_ids, 0 where
        a request has none; None when no request of the step has any."""
        runs = [self.requests.get(rid) if rid is not None else None for rid in ids]
        if not any(r is not None and r.req.token_type_ids is not None for r in runs):
            return None
        qsl = np.asarray(plan.query_start_loc[: len(ids) + 1])
        ctx = np.asarray(plan.context_lens[: len(ids)])
        types = np.zeros(int(plan.num_tokens), dtype=np.int64)
        for i, run in enumerate(runs):
            if run is None or run.req.token_type_ids is None:
                continue
            lo, hi = int(qsl[i]), int(qsl[i + 1])
            start = int(ctx[i])
            types[lo:hi] = run.req.token_type_ids[start : start + hi - lo]
        return torch.from_numpy(types)

    def _gather(
        self,
        plan: Any,
        ids: List[Optional[str]],
        completes: np.ndarray,
        hidden: List[Optional[torch.Tensor]],
    ) -> None:
        """Each request keeps the rows its pooler reads; one whose rows cannot be gathered
        fails alone."""
        ctx = np.asarray(plan.context_lens[: len(ids)]).tolist()
        for i, rid in enumerate(ids):
            run = self.requests.get(rid) if rid is not None else None
            rows = hidden[i]
            if run is None or rows is None:
                continue
            if run.num_cached_tokens is None:  # set once, at the first scheduling (vLLM)
                run.num_cached_tokens = ctx[i]
            with self._failures.guard(run.req):
                run.gather(ctx[i], rows, bool(completes[i]))

    def _fail(self, plan: Any, ids: List[Optional[str]]) -> None:
        """A failed step: its requests are aborted (their gathered rows are incomplete), the
        plan handed back to the scheduler with no tokens; the other requests go on."""
        if hasattr(self.runner, "finish_swap_out"):
            self.runner.finish_swap_out(plan)
        for rid in ids:
            if rid is not None:
                self.requests.pop(rid, None)
                self.scheduler.abort_request(rid)
        self.scheduler.update(plan, np.full(len(ids), -1, dtype=np.int64))

    def _pool(self, done: List[_Running]) -> List[torch.Tensor]:
        return self.pooler.pool(
            [r.req.task for r in done],
            [r.rows_read() for r in done],
            [r.req.prompt_token_ids for r in done],
            [r.req.pooling_params for r in done],
        )

    def _pool_each(self, done: List[_Running]) -> List[torch.Tensor]:
        """The batched heads raised: each request alone, so that only a request whose own head
        raises fails (recorded for take_request_errors; its output holds no data)."""
        data = []
        for run in done:
            x = torch.empty(0)
            with self._failures.guard(run.req):
                x = self._pool([run])[0]
            data.append(x)
        return data

    def _finish(self, done: List[_Running]) -> List[PoolingRequestOutput]:
        if not done:
            return []
        data = try_batch(lambda: self._pool(done))
        if data is FAILED:
            data = self._pool_each(done)
        return [self._output(run, x) for run, x in zip(done, data)]

    def _output(self, run: _Running, data: torch.Tensor) -> PoolingRequestOutput:
        """A finished request's output (``data`` empty: it failed, take_request_errors says
        why)."""
        req = run.req
        self.stats["prompt_tokens"] += len(req.prompt_token_ids)
        return PoolingRequestOutput(
            req.request_id,
            PoolingOutput(data),
            req.prompt_token_ids,
            True,
            req.prompt,
            run.num_cached_tokens or 0,
        )

    # ------------------------------------------------------------------ stats
    def get_stats(self) -> Dict[str, Any]:
        s = self.scheduler
        return {
            "num_requests_running": int(s.num_running),
            "num_requests_waiting": int(s.num_waiting) + int(s.num_swapped),
            "num_requests_swapped": int(s.num_swapped),
            "kv_cache_usage_perc": float(s.kv_cache_usage),
            "prefix_cache_queries": int(s.prefix_cache_query_tokens),
            "prefix_cache_hits": int(s.prefix_cache_hit_tokens),
            "num_preemptions": int(s.num_preemptions),
            "prompt_tokens": self.stats["prompt_tokens"],
            "generation_tokens": self.stats["generation_tokens"],
            "num_gpu_blocks": self.num_gpu_blocks,
            "num_free_blocks": int(s.num_free_blocks),
        }
