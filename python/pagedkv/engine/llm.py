"""LLM: offline batched inference with vLLM's user API.

    llm = LLM()                                  # the embedded SmolLM2-135M-Instruct
    outs = llm.generate(["Hello, my name is"], SamplingParams(temperature=0))
    outs = llm.chat([{"role": "user", "content": "Hi"}])
    llm = LLM(kv_cache_dtype="fp8")              # fp8 (e4m3) KV cache: 1 byte per element

Engine arguments (vLLM's names) are listed in pagedkv.engine.config.EngineConfig.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Dict, List, Optional, Sequence, Union

from pagedkv.engine.beam_search import BeamSearchOutput, BeamSearchParams, beam_search_sync
from pagedkv.engine.llm_inputs import (
    check_priority,
    normalise_conversations,
    normalise_prompts,
    per_prompt_params,
)
from pagedkv.engine.llm_pooling import PoolingMixin
from pagedkv.engine.multimodal import ChatImages
from pagedkv.engine.outputs import RequestOutput
from pagedkv.engine.request_failures import raise_request_errors
from pagedkv.engine.runner_choice import make_engine
from pagedkv.engine.sampling_params import SamplingParams
from pagedkv.lora.request import LoRARequest
from pagedkv.models.progress import progress_bar

logger = logging.getLogger("pagedkv")

PromptType = Union[str, List[int], Dict[str, Any]]
Message = Dict[str, Any]


def _ensure_log_handler() -> None:
    """Show pagedkv's INFO logs (loading progress, KV-cache size) unless the app set logging up.
    PAGEDKV_LOGGING_LEVEL (or vLLM's VLLM_LOGGING_LEVEL) overrides the level."""
    from pagedkv import envs

    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s pagedkv: %(message)s", "%m-%d %H:%M:%S")
    )
    logger.addHandler(handler)
    logger.setLevel((envs.getenv("PAGEDKV_LOGGING_LEVEL") or "INFO").upper())
    logger.propagate = False


class LLM(PoolingMixin):
    def __init__(
        self, model: Optional[str] = None, tokenizer: Optional[str] = None, **kwargs: Any
    ) -> None:
        _ensure_log_handler()
        # An LLMEngine, or a PoolingEngine for pooling models (embed / classify / score: see
        # llm_pooling.py).
        self.llm_engine = make_engine(model, tokenizer=tokenizer, **kwargs)
        self._counter = 0

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (temperature, top_p,
        top_k, min_p, repetition_penalty, max_new_tokens -> max_tokens) unless the engine was
        built with generation_config="vllm"; vLLM's defaults otherwise."""
        return SamplingParams(**self.llm_engine.model_config.generation_defaults)

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType], None] = None,
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        prompt_token_ids: Optional[List[List[int]]] = None,
        priority: Optional[List[int]] = None,
        lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
    ) -> List[RequestOutput]:
        """Runs every prompt to completion; outputs come back in input order.

        A prompt is a string, a list of token ids, or {"prompt": str} / {"prompt_token_ids":
        [...]}; ``prompts`` may be one prompt or a list. ``sampling_params`` is one for all or a
        list with one per prompt; so is ``lora_request`` (the LoRA adapter, None = the base
        model; needs enable_lora=True)."""
        self._refuse_pooling("generate")
        arch = self.llm_engine.model_config.hf_config.architecture
        items = normalise_prompts(prompts, prompt_token_ids, arch)
        loras = per_prompt_lora(lora_request, len(items))
        finals: Dict[int, SamplingParams] = {}  # one copy per distinct params object
        params = []
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        for p in per_prompt_params(sampling_params, len(items)):
            if id(p) not in finals:
                finals[id(p)] = _final_only(p)
            params.append(finals[id(p)])
        check_priority(priority, len(items))
        ids: List[str] = []
        try:
            for i, (item, p) in enumerate(zip(items, params)):
                rid = str(self._counter)
                self._counter += 1
                mm = "multi_modal_data" in item  # (the whole dict carries the images)
                self.llm_engine.add_request(
                    rid,
                    item if mm else item.get("prompt"),
                    p,
                    prompt_token_ids=None if mm else item.get("prompt_token_ids"),
                    priority=priority[i] if priority else 0,
                    lora_request=loras[i],
                )
                ids.append(rid)
        except BaseException:
            self.llm_engine.abort_request(ids)  # a bad prompt rejects the whole call
            raise
        return self._run_engine(ids, use_tqdm)

    def beam_search(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        params: BeamSearchParams,
        lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None] = None,
        use_tqdm: bool = False,
        concurrency_limit: Optional[int] = None,
    ) -> List[BeamSearchOutput]:
        """vLLM's beam search: per prompt, the ``params.beam_width`` best hypotheses (best
        first), scored as HF transformers' beam search (engine/beam_search.py). At most
        ``concurrency_limit`` prompts search at a time (None: all of them)."""
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        arch = self.llm_engine.model_config.hf_config.architecture
        items = normalise_prompts(prompts, None, arch)
        for i, item in enumerate(items):
            if item.get("multi_modal_data"):  # (a text-only model refused it above)
                raise ValueError(
                    f"prompts[{i}]['multi_modal_data']: beam_search does not take image "
                    "inputs (generate does)"
                )
        loras = per_prompt_lora(lora_request, len(items))
        limit = max(len(items), 1) if concurrency_limit is None else concurrency_limit
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"concurrency_limit must be a positive integer, got {limit!r}")
        bar = progress_bar(total=len(items), desc="Beam search") if use_tqdm else None
        try:
            outs: List[BeamSearchOutput] = []
            for at in range(0, len(items), limit):
                chunk = slice(at, at + limit)
                outs += beam_search_sync(self, items[chunk], params, loras[chunk], bar)
            return outs
        finally:
            if bar is not None:
                bar.close()

    def chat(
        self,
        messages: Union[List[Message], Sequence[List[Message]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        chat_template: Optional[str] = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
        **template_kwargs: Any,
    ) -> List[RequestOutput]:
        """Formats each conversation with the model's chat template, then generates.
        ``messages`` is one conversation, a list of {"role": str, "content": str} dicts, or a
        list of such conversations. ``chat_template_kwargs`` (vLLM's name) and any other
        keyword (continue_final_message=True, ...) become variables of the template."""
        self._refuse_pooling("chat")
        if chat_template_kwargs is not None:
            if not isinstance(chat_template_kwargs, dict):
                raise TypeError(
                    "chat_template_kwargs must be a dict, got "
                    f"{type(chat_template_kwargs).__name__}"
                )
            template_kwargs = {**chat_template_kwargs, **template_kwargs}
        tok = self.llm_engine.tokenizer
        if tok is None:
            raise ValueError("chat needs a tokenizer (the engine has skip_tokenizer_init=True)")
        gathered: List[ChatImages] = []  # one per conversation, for a model that reads images
        reader = self.llm_engine.input_processor.images
        make_images = None
        if reader is not None:

            def make_images() -> ChatImages:
                arch = self.llm_engine.input_processor.architecture
                local = self.llm_engine.config.allowed_local_media_path
                text = reader.chat_image_text(tok)
                gathered.append(
                    ChatImages(arch, text, local_media_path=local, max_images=reader.max_images)
                )
                return gathered[-1]

        convs = normalise_conversations(messages, make_images)
        prompts: List[PromptType] = []
        for i, conv in enumerate(convs):
            text = tok.apply_chat_template(
                conv,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
            # The template wrote any BOS itself: do not let encode() add another.
            item = {"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)}
            if gathered and gathered[i].images:
                item["multi_modal_data"] = {"image": gathered[i].images}
            prompts.append(item)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_engine(self, ids: List[str], use_tqdm: bool) -> List[RequestOutput]:
        engine = self.llm_engine
        wanted = set(ids)
        results: Dict[str, RequestOutput] = {}
        bar = _progress(len(ids), use_tqdm)
        try:
            while engine.has_unfinished_requests():
                outs = engine.step()
                raise_request_errors(engine.take_request_errors(), wanted)
                done = [o for o in outs if o.finished and o.request_id in wanted]
                results.update((o.request_id, o) for o in done)
                if bar is not None and done:
                    _bar_advance(bar, done)
        except BaseException:
            engine.abort_request(list(wanted - set(results)))
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[i] for i in ids]


def _final_only(p: SamplingParams) -> SamplingParams:
    """generate() returns finished requests only: ask the engine for nothing else."""
    if p.output_kind == "final_only":
        return p
    p = p.clone()
    p.output_kind = "final_only"
    return p


def _progress(total: int, use_tqdm: bool) -> Any:
    return progress_bar(total=total, desc="Processed prompts") if use_tqdm else None


def _bar_advance(bar: Any, done: List[RequestOutput]) -> None:
    """One update per engine step, however many requests it finished: a bar advanced one by one
    redraws on the first of a wave only (tqdm's mininterval), and then shows the rate of a single
    request over the whole wave until the next one (an ETA of hours for a one-minute run)."""
    bar.total_out = getattr(bar, "total_out", 0) + sum(
        len(o.token_ids) for out in done for o in out.outputs
    )
    elapsed = bar.format_dict.get("elapsed") or 0.0
    if elapsed > 0:
        bar.set_postfix_str(f"output: {bar.total_out / elapsed:.1f} toks/s", refresh=False)
    bar.update(len(done))


def per_prompt_lora(
    lora_request: Union[LoRARequest, Sequence[Optional[LoRARequest]], None], n: int
) -> List[Optional[LoRARequest]]:
    """generate()'s lora_request: one for all prompts, or a list with one per prompt."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    if not isinstance(lora_request, (list, tuple)):
        raise TypeError(
            "lora_request must be a LoRARequest, a list of them (one per prompt) "
            f"or None, got {type(lora_request).__name__}"
        )
    if len(lora_request) != n:
        raise ValueError(f"lora_request has {len(lora_request)} entries for {n} prompts")
    return list(lora_request)
