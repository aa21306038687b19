"""ModelRunner: the model, its paged KV cache, and one forward per StepPlan.

Owns the device side of a step: applies the plan's block swaps / copies, turns the plan's
numpy metadata into device tensors, and runs the model eagerly or, for decode-only steps on
CUDA, by replaying a captured CUDA graph (cuda_graph.py). Returns the final hidden states; the
engine picks the rows to turn into logits.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from pagedkv import ops
from pagedkv.balanced_decode import GRAPH_SCHEDULE, target_items
from pagedkv.cascade import CascadeDecode
from pagedkv.distributed import get_pp_group, heads_per_rank, pp_layer_range
from pagedkv.engine.config import EngineConfig
from pagedkv.engine.decode_plans import StepPlans
from pagedkv.engine.paged_backend import AttentionMetadata, PagedAttentionBackend
from pagedkv.engine.spec_decode.config import SpeculativeConfig
from pagedkv.lora.manager import LoRAManager

logger = logging.getLogger("pagedkv")

_GiB = 1 << 30


class ModelRunner:
    def __init__(
        self,
        cfg: EngineConfig,
        model: Any,
        model_config: Any,
        device: torch.device,
        dtype: torch.dtype,
        max_model_len: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.cfg, self.model, self.mc = cfg, model, model_config
        self.device, self.dtype = device, dtype
        # The ops' kv_cache_dtype string and the cache arrays' element type (uint8 for fp8).
        self.kv_cache_dtype = cfg.kv_cache_dtype
        self.cache_dtype = cfg.kv_cache_torch_dtype(dtype)
        self.max_model_len = max_model_len
        _reserve_rotary(model, max_model_len, dtype, device)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = cfg.block_size
        # This rank's share: its pipeline stage's layers, its tensor-parallel heads.
        start, end = pp_layer_range(model_config.num_hidden_layers)
        self.num_layers = end - start
        self.is_first_stage = get_pp_group().is_first_rank
        self.num_heads, self.num_kv_heads = heads_per_rank(
            model_config.num_attention_heads, model_config.num_key_value_heads
        )
        self.head_dim = model_config.head_dim
        self.kv_caches: List[torch.Tensor] = []
        self.cpu_caches: List[torch.Tensor] = []
        self.backend: Optional[PagedAttentionBackend] = None
        self.graphs: Any = None  # CudaGraphRunner once captured
        # A vision-language model (models/llava.py): its prefills may carry image rows.
        self.takes_images = hasattr(model, "encode_images")
        # M-RoPE (models/mrotary.py): steps of image requests take [3, T] positions.
        self.uses_mrope = hasattr(model, "mrope_positions")
        self.verify_graphs: Any = None  # VerifyGraphRunner (speculative decoding on CUDA)
        # A speculative draft model's runner (spec_decode/draft_model.py): its KV cache has as
        # many blocks as this one (the block ids are shared), so the blocks are sized for both.
        self.draft: Optional[ModelRunner] = None
        self.step_plans: Optional[StepPlans] = None  # the balanced decode's (allocate_kv_cache)
        self._swapped_out_step = -1  # plan.step of the last plan whose swap-outs were done
        # The adapters' device slots are allocated here, before the KV cache takes the rest.
        self.lora: Optional[LoRAManager] = (
            LoRAManager(model, cfg.max_loras, cfg.max_lora_rank, cfg.max_cpu_loras, cfg.lora_kernel)
            if cfg.enable_lora
            else None
        )

    # ------------------------------------------------------------------ KV cache sizing
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, keys and values (1 per element for fp8), the
        draft model's block included."""
        elem = torch.empty((), dtype=self.cache_dtype).element_size()
        own = 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem
        return own + (self.draft.block_bytes() if self.draft is not None else 0)

    def determine_num_blocks(self) -> tuple[int, int]:
        """(device blocks, host swap blocks) from the memory budget, as vLLM sizes them."""
        per_block = self.block_bytes()
        if self.device.type == "cuda" and self.cfg.kv_cache_space is not None:
            # Said out loud: a user who sized the cache with it would otherwise not know.
            logger.warning(
                "kv_cache_space (--kv-cache-space %g GiB) only sizes the KV cache on "
                "the CPU and is ignored on %s: there gpu_memory_utilization "
                "(--gpu-memory-utilization, now %g) sizes it",
                self.cfg.kv_cache_space,
                self.device,
                self.cfg.gpu_memory_utilization,
            )
        if self.cfg.num_gpu_blocks_override is not None:
            num_blocks = self.cfg.num_gpu_blocks_override
        elif self.device.type == "cuda":
            num_blocks = self._profile_gpu_blocks(per_block)
        else:
            space = self.cfg.kv_cache_space if self.cfg.kv_cache_space is not None else 4.0
            num_blocks = int(space * _GiB) // per_block
        if num_blocks <= 0:
            raise RuntimeError(
                "no memory left for the KV cache: raise gpu_memory_utilization / kv_cache_space "
                "or use a smaller model"
            )
        if self.cfg.num_cpu_blocks is not None:
            num_cpu = self.cfg.num_cpu_blocks
        elif self.cfg.preemption_mode == "swap":
            num_cpu = int(self.cfg.swap_space * _GiB) // per_block
        else:
            num_cpu = 0
        return num_blocks, num_cpu

    def _profile_gpu_blocks(self, per_block: int) -> int:
        """Runs a worst-case prefill step, then gives the KV cache what the budget leaves."""
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._profile_run()
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        now = torch.cuda.memory_allocated(self.device)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        # What is in use now (weights, CUDA context, other processes) plus the step's
        # activation peak must stay within the budget; the rest becomes KV cache.
        budget = total * self.cfg.gpu_memory_utilization - (total - free) - (peak - now)
        logger.info(
            "memory profiling: total %.2f GiB, in use %.2f GiB, activation peak "
            "%.2f GiB, KV-cache budget %.2f GiB",
            total / _GiB,
            (total - free) / _GiB,
            (peak - now) / _GiB,
            max(budget, 0) / _GiB,
        )
        return int(budget // per_block)

    @torch.inference_mode()
    def _profile_run(self) -> None:
        tokens, seqs = self.max_num_batched_tokens, list[int]()
        while tokens > 0 and len(seqs) < self.cfg.max_num_seqs:
            seqs.append(min(tokens, self.max_model_len))
            tokens -= seqs[-1]
        n = sum(seqs)
        # The profile runs the kernels the engine will run (fp8 ones for an fp8 cache).
        dummy = [
            torch.zeros(
                2,
                1,
                self.block_size,
                self.num_kv_heads,
                self.head_dim,
                dtype=self.cache_dtype,
                device=self.device,
            )
            for _ in range(self.num_layers)
        ]
        backend = self._make_backend(dummy)
        qsl = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
        backend.set_metadata(
            AttentionMetadata(
                num_prefills=len(seqs),
                num_prefill_tokens=n,
                num_decode_tokens=0,
                slot_mapping=torch.full((n,), -1, dtype=torch.int64, device=self.device),
                seq_lens=torch.tensor(seqs, dtype=torch.int32, device=self.device),
                query_start_loc=torch.from_numpy(qsl).to(self.device),
                block_tables=torch.zeros(len(seqs), 1, dtype=torch.int32, device=self.device),
                max_query_len=max(seqs),
                max_decode_seq_len=0,
            )
        )
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        pos = torch.cat([torch.arange(s, device=self.device) for s in seqs])
        pp = get_pp_group()
        # A later pipeline stage starts from hidden states (any values: this is a profile).
        inter = (
            None
            if pp.is_first_rank
            else torch.zeros(n, self.mc.hidden_size, dtype=self.dtype, device=self.device)
        )
        hidden = self._forward(ids, pos, backend, inter)
        if pp.is_last_rank and getattr(self.model, "lm_head", None) is not None:
            # The sampler's worst case (a pooling model has no LM head, no logits): logits of
            # max_num_seqs rows, sorted for top-k / top-p.
            rows = hidden[:1].expand(self.cfg.max_num_seqs, -1)
            self.model.compute_logits(rows).sort(dim=-1, descending=True)

    def allocate_kv_cache(self, num_blocks: int, num_cpu_blocks: int) -> None:
        shape = (2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        # Zeroed on the GPU so padded CUDA-graph rows read finite values; left lazy on the CPU
        # so an unused reservation costs no RAM.
        alloc = torch.zeros if self.device.type == "cuda" else torch.empty
        # (A zero byte is +0.0 in both fp8 formats.) Swap space holds the same bytes.
        self.kv_caches = [
            alloc(shape, dtype=self.cache_dtype, device=self.device) for _ in range(self.num_layers)
        ]
        if num_cpu_blocks:
            host_shape = (2, num_cpu_blocks) + shape[2:]
            pin = self.device.type == "cuda"
            self.cpu_caches = [
                torch.empty(host_shape, dtype=self.cache_dtype, pin_memory=pin)
                for _ in range(self.num_layers)
            ]
        self.step_plans = self._step_plans()
        self.backend = self._make_backend(self.kv_caches)
        if self.draft is not None:
            self.draft.allocate_kv_cache(num_blocks, num_cpu_blocks)
            # The draft may read a slot it never wrote (the prefix cache shares blocks it saw
            # only in part): zeros keep its logits finite; the drafts are verified anyway.
            for cache in self.draft.kv_caches:
                cache.zero_()
        kind = "GPU" if self.device.type == "cuda" else "CPU"
        logger.info(
            "# %s blocks: %d, # CPU swap blocks: %d (block_size %d, %.2f GiB KV cache, "
            "kv_cache_dtype %s)",
            kind,
            num_blocks,
            num_cpu_blocks,
            self.block_size,
            num_blocks * self.block_bytes() / _GiB,
            self._cache_dtype_name(),
        )

    def _make_backend(self, kv_caches: List[torch.Tensor]) -> PagedAttentionBackend:
        return PagedAttentionBackend(
            kv_caches,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.block_size,
            self.kv_cache_dtype,
            self.step_plans,
        )

    def _step_plans(self) -> Optional[StepPlans]:
        """The decode plans where the decode kernel has a balanced variant (the Hopper decode,
        the CPU's), else None: the balanced plans on the Hopper decode (eager steps choose per
        step, "auto"; CUDA graphs keep the partition split, balanced_decode.GRAPH_SCHEDULE), the
        cascade over shared prefixes on both unless disable_cascade_attn."""
        if not self.kv_caches:
            return None
        q = torch.empty(1, self.num_heads, self.head_dim, dtype=self.dtype, device=self.device)
        cache = self.kv_caches[0][0]
        kernel = ops.decode_kernel(q, cache, cache, self.num_kv_heads, self.kv_cache_dtype)
        if kernel not in ("hopper", "cpu"):
            return None
        cascade = None
        if not self.cfg.disable_cascade_attn:
            rows = q.new_empty((self.cfg.max_num_seqs, self.num_heads, self.head_dim))
            cascade = CascadeDecode(rows, cache, cache, self.num_kv_heads, self.kv_cache_dtype)
        if kernel == "cpu" and cascade is None:
            return None
        target = target_items(q, cache, cache, self.num_kv_heads, self.kv_cache_dtype)
        return StepPlans(
            self.cfg.max_num_seqs,
            self.num_heads,
            self.head_dim,
            target,
            self.device,
            # The CPU keeps the partition split (the balanced plans' rule is the GPU's).
            schedule="auto" if kernel == "hopper" else "partition",
            graphs=GRAPH_SCHEDULE,
            cascade=cascade,
            max_blocks=-(-self.max_model_len // self.block_size),
        )

    def _cache_dtype_name(self) -> str:
        """'fp8_e4m3' for 'fp8' (vLLM's alias); 'auto' shown as the model dtype it resolves to."""
        if self.kv_cache_dtype == "auto":
            return f"auto ({str(self.dtype).removeprefix('torch.')})"
        return "fp8_e4m3" if self.kv_cache_dtype == "fp8" else self.kv_cache_dtype

    def capture_cuda_graphs(self, max_num_seqs: int) -> None:
        if self.device.type != "cuda" or self.cfg.enforce_eager:
            return
        from pagedkv.engine.cuda_graph import CudaGraphRunner

        t0 = time.perf_counter()
        self.graphs = CudaGraphRunner(self, max_num_seqs)
        spec = SpeculativeConfig.from_dict(self.cfg.speculative_config)
        pp = get_pp_group()
        if spec is not None and pp.is_first_rank and pp.is_last_rank:
            from pagedkv.engine.spec_decode.verify_graph import VerifyGraphRunner

            self.verify_graphs = VerifyGraphRunner(self, max_num_seqs, spec.num_speculative_tokens)
            if self.draft is not None:  # its decodes, and its catch-ups of up to 2 tokens
                self.draft.capture_cuda_graphs(max_num_seqs)
                self.draft.verify_graphs = VerifyGraphRunner(self.draft, max_num_seqs, 1)
        logger.info(
            "captured CUDA graphs for decode batch sizes %s in %.1f s",
            self.graphs.batch_sizes,
            time.perf_counter() - t0,
        )

    def release_cuda_graphs(self) -> None:
        """Destroys the CUDA graphs (this runner's and its draft's) now. A rank of a parallel
        engine does before destroying or aborting its process groups: NCCL's communicator
        teardown waits until every graph that captured one of its collectives is gone (their
        persistent plans), so a graph still alive then hangs it for ever (seen on 2 H200s:
        the groups' destroy timed out; the driver's finished later, inside the next engine's
        graph capture, and broke it)."""
        for graphs in (self.graphs, self.verify_graphs):
            if graphs is not None:
                graphs.release()
        self.graphs = self.verify_graphs = None
        if self.draft is not None:
            self.draft.release_cuda_graphs()

    # ------------------------------------------------------------------ one step
    def apply_block_ops(self, plan: Any) -> None:
        """Swap out, swap in, then copy-on-write copies, in the order the plan requires."""
        out, inn, cpy = plan.blocks_to_swap_out, plan.blocks_to_swap_in, plan.blocks_to_copy
        if len(out):
            self._swap(self.kv_caches, self.cpu_caches, out)
        self._swapped_out_step = int(plan.step)
        if len(inn):
            self._swap(self.cpu_caches, self.kv_caches, inn)
        if len(cpy):
            mapping = torch.from_numpy(np.ascontiguousarray(cpy, dtype=np.int64)).to(self.device)
            ops.copy_blocks([c[0] for c in self.kv_caches], [c[1] for c in self.kv_caches], mapping)

    def finish_swap_out(self, plan: Any) -> None:
        """After a step failed: does the plan's swap-outs unless they were done. Until they
        are, nothing of the step has written the device blocks they read (they come first),
        so doing them once more after a partial run is safe too."""
        if len(plan.blocks_to_swap_out) and self._swapped_out_step != int(plan.step):
            self._swap(self.kv_caches, self.cpu_caches, plan.blocks_to_swap_out)
            self._swapped_out_step = int(plan.step)
        if self.draft is not None:  # (its cache follows the same blocks)
            self.draft.finish_swap_out(plan)

    @staticmethod
    def _swap(src: List[torch.Tensor], dst: List[torch.Tensor], pairs: Any) -> None:
        if not src or not dst:
            raise RuntimeError("the plan swaps blocks but no host swap space was allocated")
        mapping = torch.from_numpy(np.ascontiguousarray(pairs, dtype=np.int64))
        for s, d in zip(src, dst):
            ops.swap_blocks(s[0], d[0], mapping)
            ops.swap_blocks(s[1], d[1], mapping)

    @torch.inference_mode()
    def execute(
        self,
        plan: Any,
        intermediate: Optional[torch.Tensor] = None,
        lora_ids: Optional[Sequence[int]] = None,
        prev_tokens: Optional[torch.Tensor] = None,
        image_rows: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        mrope_positions: Optional[np.ndarray] = None,
    ) -> torch.Tensor:
        """Runs the plan's forward; returns hidden states [num_tokens (maybe padded), hidden].
        On a pipeline stage after the first, ``intermediate`` is the previous stage's output.
        ``lora_ids``: the LoRA adapter id of each of the plan's sequences (0 = none).
        ``prev_tokens``: the previous step's sampled tokens, on the device, when the plan was
        scheduled before they reached the host (overlapped scheduling: its input ids hold
        placeholders for them, see Scheduler.advance). ``image_rows``: (rows of the step's
        tokens, the image embeddings that replace their token embeddings), from
        multimodal.step_image_rows. ``token_type_ids``: the segment of each of the plan's
        tokens [num_tokens], for models that embed token types (BERT cross-encoders' pairs).
        ``mrope_positions``: [3, num_tokens] positions replacing the plan's (M-RoPE models,
        engine/mrope_positions.py); a step with unequal components runs eager, a decode step
        (equal ones) may replay the CUDA graphs at those positions."""
        if token_type_ids is not None:
            if intermediate is not None or image_rows is not None or prev_tokens is not None:
                raise ValueError("token_type_ids go with a plain prefill step only")
            return self._execute(plan, None, None, None, None, token_type_ids)
        if self.lora is None or lora_ids is None or not any(lora_ids):
            return self._execute(
                plan, intermediate, None, prev_tokens, image_rows, mrope_positions=mrope_positions
            )
        n_seq = int(plan.num_seqs)
        per_seq = np.diff(np.asarray(plan.query_start_loc[: n_seq + 1]))
        slots = self.lora.prepare_step(np.repeat(np.asarray(lora_ids[:n_seq]), per_seq))
        try:
            return self._execute(
                plan, intermediate, slots, prev_tokens, image_rows, mrope_positions=mrope_positions
            )
        finally:
            self.lora.end_step()

    def _execute(
        self,
        plan: Any,
        intermediate: Optional[torch.Tensor],
        lora_slots: Optional[np.ndarray],
        prev_tokens: Optional[torch.Tensor],
        image_rows: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        mrope_positions: Optional[np.ndarray] = None,
    ) -> torch.Tensor:
        """``lora_slots``: each token's adapter slot (-1 = none), None for a step without
        adapters; a decode step with adapters replays the graphs captured with them."""
        self.apply_block_ops(plan)
        n_tok, n_seq = int(plan.num_tokens), int(plan.num_seqs)
        # M-RoPE rows with three equal components (decodes: index + delta) are plain rope at
        # those positions: such a step takes them as [T] positions, CUDA graphs included.
        flat_positions = None
        if mrope_positions is not None and (mrope_positions == mrope_positions[0]).all():
            flat_positions, mrope_positions = mrope_positions[0], None
        # (the captured graphs take no token types, nor [3, T] positions)
        eager_only = token_type_ids is not None or mrope_positions is not None
        if (
            not eager_only
            and flat_positions is None
            and self.verify_graphs is not None
            and lora_slots is None
            and image_rows is None
            and intermediate is None
            and self.verify_graphs.can_run(plan)
        ):
            return self.verify_graphs.run(plan)
        if (
            not eager_only
            and self.graphs is not None
            and plan.num_prefills == 0
            and self.graphs.can_run(n_seq, int(plan.max_decode_seq_len), lora_slots is not None)
        ):
            return self.graphs.run(plan, intermediate, prev_tokens, lora_slots, flat_positions)
        seq_lens = np.asarray(plan.seq_lens[:n_seq])
        width = max(1, -(-int(seq_lens.max()) // self.block_size))
        dev = self.device
        meta = AttentionMetadata(
            num_prefills=int(plan.num_prefills),
            num_prefill_tokens=int(plan.num_prefill_tokens),
            num_decode_tokens=int(plan.num_decode_tokens),
            slot_mapping=_dev(plan.slot_mapping[:n_tok], torch.int64, dev),
            seq_lens=_dev(seq_lens, torch.int32, dev),
            query_start_loc=_dev(plan.query_start_loc[: n_seq + 1], torch.int32, dev),
            block_tables=_dev(plan.block_tables[:n_seq, :width], torch.int32, dev),
            max_query_len=int(plan.max_query_len),
            max_decode_seq_len=int(plan.max_decode_seq_len),
        )
        assert self.backend is not None
        if self.step_plans is not None:  # the decode plans of this step's decode rows
            p = int(plan.num_prefills)
            self.step_plans.begin_step(
                seq_lens[p:], plan.block_tables[p:n_seq, :width], self.block_size
            )
        self.backend.set_metadata(meta)
        ids = _dev(plan.input_ids[:n_tok], torch.int64, dev)
        if prev_tokens is not None:
            ids = fill_placeholders(ids, prev_tokens)
        if mrope_positions is not None or flat_positions is not None:
            pos = _dev(
                flat_positions if mrope_positions is None else mrope_positions, torch.int64, dev
            )
        else:
            pos = _dev(plan.positions[:n_tok], torch.int64, dev)
        if image_rows is not None:
            rows, values = image_rows
            embeds = self.model.embed(ids)
            embeds[rows.to(dev)] = values.to(embeds.dtype)
            return self.model.forward(ids, pos, self.backend, inputs_embeds=embeds)
        if token_type_ids is not None:
            types = token_type_ids.to(dev, torch.int64)  # type: ignore[union-attr]
            return self.model.forward(ids, pos, self.backend, token_type_ids=types)
        return self._forward(ids, pos, self.backend, intermediate)

    def _forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        backend: PagedAttentionBackend,
        intermediate: Optional[torch.Tensor],
    ) -> torch.Tensor:
        if intermediate is None:  # (models without pipeline stages take three arguments)
            return self.model.forward(ids, pos, backend)
        return self.model.forward(ids, pos, backend, intermediate)

    @torch.inference_mode()
    def encode_images(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        """A request's images (the HF processor's tensors) -> [placeholders, hidden] rows (the
        vision tower and projector, once per request)."""
        embeds = self.model.encode_images(**{k: v.to(self.device) for k, v in inputs.items()})
        return embeds.reshape(-1, embeds.shape[-1])

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, rows: Optional[torch.Tensor] = None, upcast: bool = True
    ) -> torch.Tensor:
        """Logits of ``hidden``'s ``rows`` (all rows when None), float32 unless ``upcast`` is
        False (see CausalLM.compute_logits). The engine's one way to logits: an executor over
        several ranks computes them where the LM head lives."""
        picked = hidden if rows is None else hidden.index_select(0, rows)
        return self.model.compute_logits(picked, upcast=upcast)


def fill_placeholders(ids: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor:
    """Input ids with each placeholder -1 - i (Scheduler.advance()) replaced by the token the
    previous step sampled for its entry i, on the device: no host round trip."""
    src = (-1 - ids).clamp_(min=0)
    return torch.where(ids < 0, prev_tokens.index_select(0, src), ids)


def _dev(arr: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.dtype != dtype:
        t = t.to(dtype)
    return to_device(t, device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without waiting for the device: a copy from pageable memory
    first waits for the stream's queued work, which would stall an overlapped step until the
    previous one finished; from pinned memory (cached by torch's host allocator) it does not."""
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _reserve_rotary(
    model: torch.nn.Module, max_model_len: int, dtype: torch.dtype, device: torch.device
) -> None:
    """Rotary tables covering every position the engine may reach (past max_position_embeddings
    under rope scaling), built before any step or graph capture."""
    from pagedkv.models.rotary import RotaryEmbedding

    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reserve(max_model_len, dtype, device)
