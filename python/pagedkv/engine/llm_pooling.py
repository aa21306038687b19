"""LLM's pooling methods (vLLM's API): embed, classify, score, reward, encode.

    llm = LLM("BAAI/bge-base-en-v1.5", task="embed")
    vec = llm.embed(["Hello"])[0].outputs.embedding
    llm = LLM("BAAI/bge-reranker-base", task="score")
    s = llm.score("What is a panda?", ["The giant panda is a bear.", "Paris"])[0].outputs.score

They run on a PoolingEngine (engine/pooling_engine.py), which LLM builds when the arguments
(task, runner, convert) or the checkpoint say pooling.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import torch.nn.functional as F

from pagedkv.engine.llm_inputs import normalise_prompts
from pagedkv.engine.pooling_outputs import (
    ClassificationRequestOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from pagedkv.engine.pooling_params import PoolingParams
from pagedkv.engine.request_failures import raise_request_errors
from pagedkv.models.progress import progress_bar

PromptType = Union[str, List[int], Dict[str, Any]]
Params = Union[PoolingParams, Sequence[PoolingParams], None]


class PoolingMixin:
    """Mixed into LLM; ``llm_engine`` is a PoolingEngine for these methods to run."""

    llm_engine: Any
    _counter: int

    # ------------------------------------------------------------------ public API
    def encode(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        pooling_params: Params = None,
        *,
        truncate_prompt_tokens: Optional[int] = None,
        use_tqdm: bool = True,
        lora_request: Any = None,
        pooling_task: Optional[str] = None,
    ) -> List[PoolingRequestOutput]:
        """The pooler's raw outputs. ``pooling_task`` (default: the engine's task) may be
        "encode": every token's final hidden states (or STEP-pooled rows)."""
        engine = self._pooling_engine("encode")
        task = pooling_task or engine.task
        return self._pool(
            prompts, pooling_params, task, truncate_prompt_tokens, use_tqdm, lora_request
        )

    def embed(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        truncate_prompt_tokens: Optional[int] = None,
        use_tqdm: bool = True,
        pooling_params: Params = None,
        lora_request: Any = None,
    ) -> List[EmbeddingRequestOutput]:
        self._pooling_engine("embed")
        outs = self._pool(
            prompts, pooling_params, "embed", truncate_prompt_tokens, use_tqdm, lora_request
        )
        return [EmbeddingRequestOutput.from_base(o) for o in outs]

    def classify(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        truncate_prompt_tokens: Optional[int] = None,
        use_tqdm: bool = True,
        pooling_params: Params = None,
        lora_request: Any = None,
    ) -> List[ClassificationRequestOutput]:
        self._pooling_engine("classify")
        outs = self._pool(
            prompts, pooling_params, "classify", truncate_prompt_tokens, use_tqdm, lora_request
        )
        return [ClassificationRequestOutput.from_base(o) for o in outs]

    def reward(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        *,
        truncate_prompt_tokens: Optional[int] = None,
        use_tqdm: bool = True,
        pooling_params: Params = None,
        lora_request: Any = None,
    ) -> List[PoolingRequestOutput]:
        self._pooling_engine("reward")
        return self._pool(
            prompts, pooling_params, "reward", truncate_prompt_tokens, use_tqdm, lora_request
        )

    def score(
        self,
        data_1: Union[PromptType, Sequence[PromptType]],
        data_2: Union[PromptType, Sequence[PromptType]],
        /,
        *,
        truncate_prompt_tokens: Optional[int] = None,
        use_tqdm: bool = True,
        pooling_params: Optional[PoolingParams] = None,
        lora_request: Any = None,
    ) -> List[ScoringRequestOutput]:
        """One score per (data_1, data_2) pair: one data_1 against every data_2, or the two
        lists pairwise. A cross-encoder (a classifier with one label) scores the pair as one
        input (the tokenizer's text pair); an embedding model scores the cosine of the two
        embeddings (vLLM's rule)."""
        engine = self._pooling_engine("score")
        left, right = _pairs(data_1, data_2)
        if pooling_params is not None and not isinstance(pooling_params, PoolingParams):
            raise TypeError(
                f"pooling_params must be a PoolingParams, got {type(pooling_params).__name__}"
            )
        if engine.pooler.is_classifier:
            prompts = [self._pair_prompt(a, b) for a, b in zip(left, right)]
            outs = self._pool(
                prompts, pooling_params, "score", truncate_prompt_tokens, use_tqdm, lora_request
            )
            return [ScoringRequestOutput.from_base(o) for o in outs]
        texts = left + right
        embs = self._pool(
            texts, pooling_params, "embed", truncate_prompt_tokens, use_tqdm, lora_request
        )
        n = len(left)
        return [_cosine(a, b) for a, b in zip(embs[:n], embs[n:])]

    # ------------------------------------------------------------------ helpers
    def _pooling_engine(self, method: str) -> Any:
        from pagedkv.engine.pooling_engine import PoolingEngine

        engine = self.llm_engine
        if not isinstance(engine, PoolingEngine):
            raise ValueError(
                f"LLM.{method} needs a pooling model: this LLM generates text. Build it with "
                f"LLM(model, task='embed' / 'classify' / 'score' / 'reward') or "
                "runner='pooling' (or convert='embed')"
            )
        return engine

    def _refuse_pooling(self, method: str) -> None:
        """generate / chat on a pooling engine: name the task it serves."""
        from pagedkv.engine.pooling_engine import PoolingEngine

        engine = self.llm_engine
        if isinstance(engine, PoolingEngine):
            raise ValueError(
                f"LLM.{method} needs a generative model: this LLM serves the pooling task "
                f"{engine.task!r}; use LLM.{_METHODS[engine.task]}"
            )

    def _pair_prompt(self, a: PromptType, b: PromptType) -> Dict[str, Any]:
        tok = self.llm_engine.tokenizer
        if not isinstance(a, str) or not isinstance(b, str):
            raise TypeError("a cross-encoder scores text pairs: data_1 and data_2 must be strings")
        if tok is None:
            raise ValueError("score needs a tokenizer (skip_tokenizer_init=True)")
        return pair_prompt(tok, a, b)

    def _pool(
        self,
        prompts: Any,
        pooling_params: Params,
        task: str,
        truncate_prompt_tokens: Optional[int],
        use_tqdm: bool,
        lora_request: Any,
    ) -> List[PoolingRequestOutput]:
        if lora_request is not None:
            raise ValueError("lora_request with a pooling model is not supported yet")
        items = normalise_prompts(prompts, None, extra_keys=("token_type_ids",))
        params = _per_prompt(pooling_params, len(items), task, truncate_prompt_tokens)
        engine = self.llm_engine
        ids: List[str] = []
        try:
            for item, p in zip(items, params):
                rid = str(self._counter)
                self._counter += 1
                engine.add_request(rid, item, p)
                ids.append(rid)
        except BaseException:
            engine.abort_request(ids)  # a bad prompt rejects the whole call
            raise
        return _run(engine, ids, use_tqdm)


def pair_prompt(tokenizer: Any, a: str, b: str, add_special_tokens: bool = True) -> Dict[str, Any]:
    """A cross-encoder's input: the tokenizer's (a, b) text pair as a prompt dict, with its
    token_type_ids where the second segment has types of its own (BERT cross-encoders; an
    XLM-R tokenizer gives all zeros, which the prompt leaves out). ``add_special_tokens``:
    the pair template's [CLS] / [SEP] (the server's add_special_tokens field)."""
    enc = tokenizer.hf(a, b, add_special_tokens=add_special_tokens)
    prompt: Dict[str, Any] = {"prompt_token_ids": list(enc["input_ids"])}
    types = enc.get("token_type_ids")
    if types is not None and any(types):
        prompt["token_type_ids"] = [int(t) for t in types]
    return prompt


_METHODS = {"embed": "embed", "classify": "classify", "score": "score", "reward": "reward"}


def _per_prompt(params: Params, n: int, task: str, truncate: Optional[int]) -> List[PoolingParams]:
    if params is None or isinstance(params, PoolingParams):
        given = [params or PoolingParams()] * n
    elif isinstance(params, (list, tuple)):
        if len(params) != n:
            raise ValueError(f"pooling_params: got {len(params)} for {n} prompts")
        given = list(params)
    else:
        raise TypeError(
            f"pooling_params must be a PoolingParams or a list of them, got {type(params).__name__}"
        )
    out = []
    for i, p in enumerate(given):
        if not isinstance(p, PoolingParams):
            raise TypeError(f"pooling_params[{i}] must be a PoolingParams, got {type(p).__name__}")
        if p.task is not None and p.task != task:
            raise ValueError(f"pooling_params.task={p.task!r} differs from this call's {task!r}")
        p = p.clone()
        p.task = task
        if truncate is not None:
            p.truncate_prompt_tokens = truncate
            p._check_types()
        out.append(p)
    return out


def _pairs(data_1: Any, data_2: Any) -> tuple[List[Any], List[Any]]:
    one = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
    two = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
    if not one or not two:
        raise ValueError("score: data_1 and data_2 must not be empty")
    if len(one) == 1:
        one = one * len(two)
    if len(one) != len(two):
        raise ValueError(
            f"score: data_1 has {len(one)} items and data_2 {len(two)}; give one data_1 or "
            "as many as data_2"
        )
    return one, two


def _cosine(a: PoolingRequestOutput, b: PoolingRequestOutput) -> ScoringRequestOutput:
    score = F.cosine_similarity(a.outputs.data.float(), b.outputs.data.float(), dim=-1)
    return ScoringRequestOutput(
        f"{a.request_id}_{b.request_id}",
        ScoringOutput(float(score)),
        a.prompt_token_ids + b.prompt_token_ids,
        True,
    )


def _run(engine: Any, ids: List[str], use_tqdm: bool) -> List[PoolingRequestOutput]:
    wanted = set(ids)
    results: Dict[str, PoolingRequestOutput] = {}
    bar = progress_bar(total=len(ids), desc="Processed prompts") if use_tqdm else None
    try:
        while engine.has_unfinished_requests():
            done = [o for o in engine.step() if o.request_id in wanted]
            raise_request_errors(engine.take_request_errors(), wanted)
            results.update((o.request_id, o) for o in done)
            if bar is not None and done:
                bar.update(len(done))
    except BaseException:
        engine.abort_request(list(wanted - set(results)))
        raise
    finally:
        if bar is not None:
            bar.close()
    return [results[i] for i in ids]
