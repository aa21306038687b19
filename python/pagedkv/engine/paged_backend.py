"""The attention backend the models run on: pagedkv ops over a paged NHD KV cache.

Per layer and step: write the new keys/values into the cache (reshape_and_cache_flash; in the
model dtype, or as fp8 bytes with kv_cache_dtype "fp8" / "fp8_e4m3" / "fp8_e5m2"), then
attend as the layer's AttentionSpec says (scale, sliding window, soft cap) — prefill / extend
tokens (which come first in the batch) with context_attention_fwd,
which reads the cached context from the pages and the new tokens from k/v; decode tokens (one
per sequence, after the prefills) with paged_attention_v1/v2, or on a work-balanced plan
(paged_attention_balanced; pagedkv.balanced_decode.StepPlans decides per step and window). The
step's metadata is set once per forward by the model runner (``set_metadata``), so the model
code stays cache-agnostic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from pagedkv import ops
from pagedkv.engine.decode_plans import StepPlans
from pagedkv.models.attention_backend import AttentionSpec

# Keys per partition of paged_attention_v2 on the CPU (vLLM's _PARTITION_SIZE, the kernels' one
# constant). On CUDA the split comes from ops.decode_partition_size.
_PARTITION_SIZE = ops.PARTITION_SIZE


@dataclass
class AttentionMetadata:
    """Device tensors for one forward; prefill entries first, then decode entries."""

    num_prefills: int
    num_prefill_tokens: int
    num_decode_tokens: int
    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = padding token (not written)
    seq_lens: torch.Tensor  # [num_seqs] int32, context + query
    query_start_loc: torch.Tensor  # [num_prefills + 1] int32 (prefix sums of the prefill queries)
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32
    max_query_len: int  # longest prefill query
    max_decode_seq_len: int  # longest decode sequence (a bound under CUDA graphs)


class PagedAttentionBackend:
    """AttentionBackend (see pagedkv.models.attention_backend) over per-layer paged caches."""

    def __init__(
        self,
        kv_caches: List[torch.Tensor],
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        kv_cache_dtype: str = "auto",
        step_plans: Optional[StepPlans] = None,
    ) -> None:
        # kv_caches[layer]: [2, num_blocks, block_size, num_kv_heads, head_dim] (k, v), NHD;
        # the model dtype with kv_cache_dtype "auto", uint8 (fp8 bytes) otherwise.
        self.kv_caches = kv_caches
        self.kv_cache_dtype = kv_cache_dtype
        # Checkpoints here carry no KV scales and we do not calibrate: 1.0, as vLLM defaults.
        self.k_scale = self.v_scale = 1.0
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim, self.block_size = head_dim, block_size
        self.meta: Optional[AttentionMetadata] = None
        # The balanced decode's plans (None: the partition split only); the runner begins each
        # step on them with the decode rows' host lengths.
        self.step_plans = step_plans

    def set_metadata(self, meta: AttentionMetadata) -> None:
        self.meta = meta

    def forward(
        self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        meta = self.meta
        assert meta is not None, "set_metadata() must be called before the forward"
        key_cache, value_cache = self.kv_caches[layer_idx][0], self.kv_caches[layer_idx][1]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ops.reshape_and_cache_flash(
            k,
            v,
            key_cache,
            value_cache,
            meta.slot_mapping,
            self.kv_cache_dtype,
            self.k_scale,
            self.v_scale,
        )
        out = torch.empty_like(q)
        p = meta.num_prefill_tokens
        if meta.num_prefills:
            self._prefill(meta, spec, out[:p], q[:p], k[:p], v[:p], key_cache, value_cache)
        if meta.num_decode_tokens:
            self._decode(meta, spec, out[p:], q[p:], key_cache, value_cache)
        return out

    def _prefill(
        self,
        meta: AttentionMetadata,
        spec: AttentionSpec,
        out: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> None:
        n = meta.num_prefills
        ops.context_attention_fwd(
            q,
            k,
            v,
            out,
            self.kv_cache_dtype,
            key_cache,
            value_cache,
            meta.block_tables[:n],
            meta.query_start_loc[: n + 1],
            meta.seq_lens[:n],
            None,
            meta.max_query_len,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            sliding_window=spec.sliding_window,
            sm_scale=spec.scale,
            logits_soft_cap=spec.logits_soft_cap,
            causal=spec.causal,
        )

    def _decode(
        self,
        meta: AttentionMetadata,
        spec: AttentionSpec,
        out: torch.Tensor,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> None:
        if not spec.causal:  # an encoder's token would need keys that come after it
            raise ValueError("non-causal (encoder) attention has no decode step")
        n = meta.num_prefills
        block_tables, seq_lens = meta.block_tables[n:], meta.seq_lens[n:]
        max_len = meta.max_decode_seq_len
        if self.step_plans is not None and self._cascade(
            spec, out, q, key_cache, value_cache, max_len
        ):
            return
        partition_size = self._partition_size(q, key_cache, value_cache, max_len)
        plan = (
            None
            if self.step_plans is None
            else self.step_plans.for_layer(spec.sliding_window or 0, partition_size)
        )
        # The decode ops' arguments after out (and v2's buffers), in vLLM's order.
        args = (
            q,
            key_cache,
            value_cache,
            self.num_kv_heads,
            spec.scale,
            block_tables,
            seq_lens,
        )
        scaled = (self.kv_cache_dtype, self.k_scale, self.v_scale)
        cap, window = spec.logits_soft_cap, spec.sliding_window
        if plan is not None:
            plan.run(out, *args, max_len, None, *scaled, logits_soft_cap=cap, sliding_window=window)
            return
        if partition_size == 0:
            ops.paged_attention_v1(
                out,
                *args,
                self.block_size,
                max_len,
                None,
                *scaled,
                logits_soft_cap=cap,
                sliding_window=window,
            )
            return
        num_partitions = (max_len + partition_size - 1) // partition_size
        num_seqs = q.shape[0]
        exp_sums = torch.empty(
            num_seqs, self.num_heads, num_partitions, dtype=torch.float32, device=q.device
        )
        max_logits = torch.empty_like(exp_sums)
        tmp_out = torch.empty(
            num_seqs,
            self.num_heads,
            num_partitions,
            self.head_dim,
            dtype=torch.float32,
            device=q.device,
        )
        ops.paged_attention_v2(
            out,
            exp_sums,
            max_logits,
            tmp_out,
            *args,
            self.block_size,
            max_len,
            None,
            *scaled,
            logits_soft_cap=cap,
            sliding_window=window,
            partition_size=partition_size,
        )

    def _cascade(
        self,
        spec: AttentionSpec,
        out: torch.Tensor,
        q: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        max_len: int,
    ) -> bool:
        """The cascade decode where this step's rows share a prefix (StepPlans); False if not."""
        assert self.step_plans is not None
        got = self.step_plans.cascade_for_layer(int(q.shape[0]), spec.sliding_window or 0, max_len)
        if got is None:
            return False
        got.cascade.run(
            out,
            q,
            key_cache,
            value_cache,
            spec.scale,
            got.prefix_table,
            got.own_tables,
            got.own_lens,
            got.max_own_len,
            self.k_scale,
            self.v_scale,
            spec.logits_soft_cap,
        )
        return True

    def _partition_size(
        self, q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, max_len: int
    ) -> int:
        """0 (single pass) or the split-K partition. On CUDA the library's choice
        (ops.decode_partition_size: split only a batch that leaves the GPU under-filled, for the
        kernel that runs); it depends on shapes alone, fixed for a captured CUDA graph (which is
        captured at the model's maximum length). On the CPU: 512-key partitions past 512 keys
        (the CPU kernels parallelise over partitions)."""
        if q.is_cuda:
            return ops.decode_partition_size(
                q, key_cache, value_cache, self.num_kv_heads, max_len, self.kv_cache_dtype
            )
        return _PARTITION_SIZE if max_len > _PARTITION_SIZE else 0
