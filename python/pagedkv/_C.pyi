"""pagedkv C++ core: block allocator, scheduler and paged-attention ops"""

from collections.abc import Sequence
from typing import Annotated

import numpy
import numpy.typing
from numpy.typing import NDArray


__version__: str

def cuda_available() -> bool:
    """True when pagedkv was built with CUDA and a CUDA device is usable now."""

def cuda_device_count() -> int:
    """Number of usable CUDA devices."""

def build_info() -> dict:
    """
    How this copy of pagedkv was built: version, CUDA or not, architectures, compiler.
    """

ROOT_BLOCK_HASH: tuple = (0, 0)

def hash_block(parent: tuple[int, int] | None, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0) -> tuple[int, int]:
    """
    128-bit chained hash H(parent, tokens, extra_key) as (lo, hi); parent None = root.
    """

class BlockAllocator:
    """
    KV-cache block pool: ref counts, copy-on-write, host swap pool and automatic prefix caching.
    """

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int = 0, enable_prefix_caching: bool = True) -> None: ...

    @staticmethod
    def hash_block(parent: tuple[int, int] | None, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0) -> tuple[int, int]:
        """
        128-bit chained hash H(parent, tokens, extra_key) as (lo, hi); parent None = root.
        """

    ROOT_HASH: tuple = (0, 0)

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def num_cpu_blocks(self) -> int: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @property
    def num_free_blocks(self) -> int:
        """Blocks allocate() can hand out (includes evictable cached ones)."""

    @property
    def num_used_blocks(self) -> int:
        """Blocks with ref > 0."""

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (in use or free)."""

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix."""

    @property
    def num_free_cpu_blocks(self) -> int: ...

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (kv_cache_usage_perc)."""

    def allocate(self, n: int) -> list[int]:
        """
        n fresh blocks (ref 1); MemoryError (nothing allocated) if fewer are free.
        """

    def free(self, ids: Sequence[int]) -> None:
        """
        Drops one reference per id (a sequence's blocks in order; freed tail first).
        """

    def fork(self, ids: Sequence[int]) -> None:
        """Adds one reference per id (all must be allocated)."""

    def ref_count(self, id: int) -> int: ...

    def copy_on_write(self, id: int) -> tuple[int, bool]:
        """
        Before writing into `id`: (new_id, True) with the copy recorded if it is shared or cached, else (id, False).
        """

    def take_pending_copies(self) -> Annotated[NDArray[numpy.int64], dict(shape=(None, 2))]:
        """
        Recorded (src, dst) block copies as an [n, 2] int64 array (clears the list).
        """

    def swap_out(self, ids: Sequence[int]) -> tuple[list[int], numpy.typing.NDArray[numpy.int64]]:
        """
        Moves blocks to the host pool: (cpu_ids, [n, 2] (device, host) mapping).
        """

    def swap_in(self, cpu_ids: Sequence[int]) -> tuple[list[int], numpy.typing.NDArray[numpy.int64]]:
        """Moves blocks back: (ids, [n, 2] (host, device) mapping)."""

    def free_cpu(self, cpu_ids: Sequence[int]) -> None:
        """Releases host blocks (e.g. a swapped-out sequence was aborted)."""

    def cpu_ref_count(self, id: int) -> int: ...

    def match_prefix(self, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0, max_blocks: int | None = None) -> list[int]:
        """
        Longest cached run of full blocks of `tokens` (at most max_blocks); each returned block gets one reference. Counts a query of len(tokens) tokens.
        """

    def peek_prefix(self, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0, max_blocks: int | None = None) -> int:
        """
        Number of blocks match_prefix would return now (takes no references, counts nothing).
        """

    def match_prefix_partial(self, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0, max_tokens: int | None = None) -> tuple[list[int], int]:
        """
        Token-granular match: (block_ids, num_cached_tokens). Full blocks as match_prefix; when the match ends inside a block, the last id is a fresh block whose first num_cached_tokens % block_size slots get copied from a cached block (the copy is in take_pending_copies()).
        """

    def cache_full_block(self, id: int, parent: tuple[int, int] | None, tokens: Sequence[int] | numpy.typing.NDArray[numpy.int32], extra_key: int = 0) -> tuple[int, int]:
        """
        Registers full block `id` (its tokens, child of `parent`; None = root) in the prefix cache and returns its hash. A duplicate of cached content stays uncached.
        """

    def block_hash(self, id: int) -> tuple[int, int] | None:
        """The cached hash of `id`, or None when it holds none."""

    def reset_prefix_cache(self) -> None:
        """Drops every cached hash; blocks in use are unaffected."""

    def stats(self) -> dict[str, int]:
        """Gauges and counters for metrics, as a dict of ints."""

    def check_invariants(self) -> str:
        """
        Full O(num_blocks) consistency check: '' when consistent, else the first problems.
        """

    def __repr__(self) -> str: ...

class SchedulerConfig:
    """Scheduler settings (vLLM names). Raises ValueError naming a bad field."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048, enable_chunked_prefill: bool = True, enable_prefix_caching: bool = True, num_cpu_blocks: int = 0, preemption_mode: str = 'recompute', policy: str = 'fcfs', max_model_len: int | None = None) -> None: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def max_num_batched_tokens(self) -> int: ...

    @property
    def enable_chunked_prefill(self) -> bool: ...

    @property
    def enable_prefix_caching(self) -> bool: ...

    @property
    def num_cpu_blocks(self) -> int: ...

    @property
    def preemption_mode(self) -> str: ...

    @property
    def policy(self) -> str: ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt + max_tokens (default: num_blocks * block_size)"""

    @property
    def max_blocks_per_seq(self) -> int:
        """Row width of StepPlan.block_tables"""

    def __repr__(self) -> str: ...

class FinishedRequest:
    """
    A sequence the scheduler finished: request_id, reason ('stop' for an EOS or stop id, 'length' for max_tokens) and stop_token_id (the stop id that ended it; None for EOS and length).
    """

    @property
    def request_id(self) -> str: ...

    @property
    def reason(self) -> str: ...

    @property
    def stop_token_id(self) -> int | None: ...

    @property
    def is_eos(self) -> bool: ...

    def __repr__(self) -> str: ...

class StepPlan:
    """
    One step's batch: prefills first, then decodes. Arrays are views valid until the next schedule(). Apply blocks_to_swap_out, blocks_to_swap_in, then blocks_to_copy before running the model. block_tables is padded with 0.
    """

    @property
    def num_seqs(self) -> int: ...

    @property
    def num_prefills(self) -> int: ...

    @property
    def num_prefill_tokens(self) -> int: ...

    @property
    def num_decode_tokens(self) -> int: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def max_query_len(self) -> int: ...

    @property
    def max_prefill_seq_len(self) -> int: ...

    @property
    def max_decode_seq_len(self) -> int: ...

    @property
    def max_blocks_per_seq(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def num_draft_tokens_total(self) -> int:
        """Draft tokens fed in this step (0: no speculative entry)"""

    @property
    def num_draft_tokens(self) -> NDArray[numpy.int32]:
        """
        [num_seqs] int32 draft tokens fed after each entry's last token (speculative decoding; such an entry is laid out with the prefills)
        """

    def __len__(self) -> int: ...

    @property
    def request_ids(self) -> list:
        """list[str] in batch order (None for an entry aborted since schedule())"""

    @property
    def preempted_ids(self) -> list:
        """
        Requests recompute-preempted this step (they resume later, losing nothing)
        """

    @property
    def input_ids(self) -> NDArray[numpy.int32]:
        """[num_tokens] int32"""

    @property
    def positions(self) -> NDArray[numpy.int64]:
        """[num_tokens] int64"""

    @property
    def slot_mapping(self) -> NDArray[numpy.int64]:
        """[num_tokens] int64 block*block_size+offset"""

    @property
    def seq_lens(self) -> NDArray[numpy.int32]:
        """[num_seqs] int32 context + query"""

    @property
    def context_lens(self) -> NDArray[numpy.int32]:
        """[num_seqs] int32 tokens cached before"""

    @property
    def query_start_loc(self) -> NDArray[numpy.int32]:
        """[num_seqs + 1] int32"""

    @property
    def seq_start_loc(self) -> NDArray[numpy.int32]:
        """[num_seqs + 1] int32"""

    @property
    def sample_indices(self) -> NDArray[numpy.int32]:
        """
        [num_seqs] int32 token index sampled for each entry, -1 = partial chunk
        """

    @property
    def block_tables(self) -> NDArray[numpy.int32]:
        """[num_seqs, max_blocks_per_seq] int32, padded with 0"""

    @property
    def blocks_to_swap_out(self) -> NDArray[numpy.int64]:
        """[k, 2] int64 (device block, host block)"""

    @property
    def blocks_to_swap_in(self) -> NDArray[numpy.int64]:
        """[k, 2] int64 (host block, device block)"""

    @property
    def blocks_to_copy(self) -> NDArray[numpy.int64]:
        """[k, 2] int64 (src block, dst block)"""

    def __repr__(self) -> str: ...

class Scheduler:
    """Continuous-batching scheduler over a paged KV cache (C++)."""

    def __init__(self, config: SchedulerConfig) -> None: ...

    @property
    def config(self) -> SchedulerConfig: ...

    def add_request(self, request_id: str, prompt_token_ids: object, max_tokens: int, eos_token_id: int | None = None, eos_token_ids: object | None = (), stop_token_ids: object | None = (), priority: int = 0, ignore_eos: bool = False, min_tokens: int = 0, cache_salt: object | None = 0) -> None:
        """
        Queue a request. It finishes on any of eos_token_ids (and eos_token_id), unless ignore_eos, or stop_token_ids, once it has min_tokens; or at max_tokens. ValueError for an empty prompt, a duplicate id, prompt + max_tokens > max_model_len, or a request that could never fit in num_blocks.
        """

    def abort_request(self, request_id: str) -> bool:
        """Remove a request and free its blocks; False if unknown."""

    def schedule(self) -> StepPlan:
        """Plan the next step (a StepPlan)."""

    def update(self, plan: StepPlan, sampled_token_ids: object) -> list[FinishedRequest]:
        """
        Apply a step's sampled tokens (one per plan entry, -1 where the entry does not sample). Returns the requests that finished (they are freed), with their reasons.
        """

    def advance(self, plan: StepPlan) -> None:
        """
        Overlap: the plan ran; each sampling entry i holds placeholder token -1 - i until resolve(). schedule() may run next.
        """

    def resolve(self, sampled_token_ids: object) -> list[FinishedRequest]:
        """
        Overlap: the advanced step's tokens (one per entry of its plan). Returns the finished requests; their entries in a plan scheduled since become slot -1.
        """

    @property
    def has_unresolved_step(self) -> bool: ...

    def would_finish(self, request_id: str, token: int) -> FinishedRequest | None:
        """Whether `token` as the request's next token would finish it (and why)."""

    def update_accepted(self, plan: StepPlan, token_ids: object, num_accepted: object) -> list:
        """
        Speculative steps: entry i emitted num_accepted[i] tokens (its accepted drafts, then the target's token; 0 for an entry that samples nothing), concatenated in token_ids. Rejected drafts' KV blocks are given back. Returns the finished requests (FinishedRequest), as update() does.
        """

    @property
    def num_appended(self) -> list[int]:
        """
        Per entry of the last updated plan: tokens appended (fewer than emitted after a stop)
        """

    def set_draft_tokens(self, request_id: str, draft_token_ids: object) -> None:
        """
        Speculative decoding: tokens proposed to follow the request; the next schedule() feeds them (or fewer) after its last token if it decodes, and consumes them.
        """

    def fork(self, parent_id: str, child_id: str, first_token: int) -> FinishedRequest | None:
        """
        n > 1 sampling: a child sharing the parent's prompt blocks. Returns why it finished at once (it is then freed), or None.
        """

    def has_unfinished_requests(self) -> bool: ...

    def get_token_ids(self, request_id: str) -> list[int]: ...

    def get_num_generated(self, request_id: str) -> int: ...

    def __contains__(self, arg: str, /) -> bool: ...

    @property
    def num_free_blocks(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_swapped(self) -> int: ...

    @property
    def num_free_cpu_blocks(self) -> int: ...

    @property
    def num_preemptions(self) -> int: ...

    @property
    def prefix_cache_query_tokens(self) -> int: ...

    @property
    def prefix_cache_hit_tokens(self) -> int: ...

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of device blocks in use (0..1)"""

KV_CACHE_DTYPES: tuple = ('auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2')

ATTENTION_KERNELS: tuple = ...

SUPPORTED_HEAD_SIZES: tuple = (32, 64, 80, 96, 112, 120, 128, 192, 256)

PARTITION_SIZE: int = 512

BALANCED_MIN_CHUNK: int = 128

BALANCED_ITEM_INTS: int = 4

def ops_reshape_and_cache(key: NDArray, value: NDArray, key_cache: NDArray, value_cache: NDArray, slot_mapping: NDArray, kv_cache_dtype: str, k_scale: float, v_scale: float, flash: bool, stream: int = 0, k_scale_array: NDArray | None = None, v_scale_array: NDArray | None = None) -> None:
    """
    Writes key/value [num_tokens, num_kv_heads, head_size] into the paged caches at slot_mapping (vLLM layout, or NHD when flash=True).
    """

def ops_paged_attention_v1(out: NDArray, query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, scale: float, block_tables: NDArray, seq_lens: NDArray, max_seq_len: int, alibi_slopes: NDArray | None, kv_cache_dtype: str, k_scale: float, v_scale: float, logits_soft_cap: float = 0.0, sliding_window: int = -1, stream: int = 0, kernel: str = 'auto', k_scale_array: NDArray | None = None, v_scale_array: NDArray | None = None) -> None:
    """Decode attention over a paged KV cache, single pass; writes `out`."""

def ops_paged_attention_v2(out: NDArray, exp_sums: NDArray, max_logits: NDArray, tmp_out: NDArray, query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, scale: float, block_tables: NDArray, seq_lens: NDArray, max_seq_len: int, alibi_slopes: NDArray | None, kv_cache_dtype: str, k_scale: float, v_scale: float, logits_soft_cap: float = 0.0, sliding_window: int = -1, partition_size: int = 512, stream: int = 0, kernel: str = 'auto', k_scale_array: NDArray | None = None, v_scale_array: NDArray | None = None) -> None:
    """
    Decode attention split into partitions (exp_sums / max_logits / tmp_out), then merged.
    """

def ops_paged_attention_balanced(out: NDArray, exp_sums: NDArray, max_logits: NDArray, tmp_out: NDArray, query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, scale: float, block_tables: NDArray, seq_lens: NDArray, work_items: NDArray, seq_offsets: NDArray, max_seq_len: int, alibi_slopes: NDArray | None, kv_cache_dtype: str, k_scale: float, v_scale: float, logits_soft_cap: float = 0.0, sliding_window: int = -1, stream: int = 0, kernel: str = 'auto', k_scale_array: NDArray | None = None, v_scale_array: NDArray | None = None, lse: NDArray | None = None) -> None:
    """
    Work-balanced decode attention over a plan (ops_plan_balanced_decode): each work item's partial into its workspace row, then each sequence's rows merged into `out` (and their log-sum-exps into `lse` [num_heads, num_seqs] when given).
    """

def ops_merge_attn_states(output: NDArray, prefix_output: NDArray, prefix_lse: NDArray, suffix_output: NDArray, suffix_lse: NDArray, output_lse: NDArray | None = None, stream: int = 0) -> None:
    """
    Merges two attention results over disjoint keys by their log-sum-exps (vLLM merge_attn_states).
    """

def ops_plan_balanced_decode(seq_lens: NDArray, work_items: NDArray, seq_offsets: NDArray, target_items: int, sliding_window: int = -1, min_chunk: int = 128) -> int:
    """
    Fills a work-balanced decode plan (host int32 arrays) from host seq_lens; returns the work items used.
    """

def ops_balanced_decode_target(query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, kv_cache_dtype: str, kernel: str = 'auto') -> int:
    """
    The work items a balanced decode runs at once on this call's device (the planner's target_items).
    """

def ops_context_attention_fwd(out: NDArray, query: NDArray, key: NDArray, value: NDArray, key_cache: NDArray, value_cache: NDArray, block_tables: NDArray, query_start_loc: NDArray, seq_lens: NDArray, max_query_len: int, scale: float, alibi_slopes: NDArray | None, kv_cache_dtype: str, k_scale: float, v_scale: float, logits_soft_cap: float = 0.0, sliding_window: int = -1, stream: int = 0, kernel: str = 'auto', k_scale_array: NDArray | None = None, v_scale_array: NDArray | None = None, causal: bool = True) -> None:
    """
    Prefill/extend attention: new tokens attend causally to the cached context and themselves (causal=False: to all of their sequence's keys); writes `out`.
    """

def ops_copy_blocks(key_caches: Sequence[NDArray], value_caches: Sequence[NDArray], block_mapping: NDArray, stream: int = 0) -> None:
    """Copies blocks (src, dst) within every layer's caches."""

def ops_swap_blocks(src: NDArray, dst: NDArray, block_mapping: NDArray, stream: int = 0) -> None:
    """Copies blocks from src to dst (host <-> device or host <-> host)."""

def ops_decode_kernel(query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, kv_cache_dtype: str, kernel: str = 'auto') -> str:
    """
    The decode kernel paged_attention_v1 / v2 run for this call under the choice `kernel`: 'cpu', 'hopper', 'tensor_core' or 'cuda_core'.
    """

def ops_decode_partition_size(query: NDArray, key_cache: NDArray, value_cache: NDArray, num_kv_heads: int, max_seq_len: int, kv_cache_dtype: str, kernel: str = 'auto') -> int:
    """
    The split-K partition for paged_attention_v2 on this call's kernel and device, or 0 for the single pass (paged_attention_v1).
    """

def ops_decode_partition_rule(kernel: str, num_seqs: int, num_heads: int, num_kv_heads: int, max_seq_len: int, block_size: int, num_sms: int, kv_cache_dtype: str) -> int:
    """ops_decode_partition_size's rule for a given kernel and GPU size."""

def ops_num_threads() -> int:
    """
    Threads used by the CPU kernels (ops_set_num_threads's count, else the usable CPUs).
    """

def ops_set_num_threads(n: int) -> None:
    """
    Fixes the CPU kernels' thread count before their first use (ValueError afterwards unless it is the count in use).
    """

def ops_set_decode_timeline_file(path: str) -> None:
    """
    Profiling builds (PAGEDKV_DECODE_TIMELINE=ON): the file each Hopper decode call appends its per-CTA timer stamps to ('' stops); ValueError in other builds.
    """

def moe_topk_softmax(topk_weights: NDArray, topk_ids: NDArray, gating_output: NDArray, renormalize: bool, stream: int = 0) -> None:
    """
    Softmax over the experts, then the top-k weights [T, k] float32 and ids [T, k] int32.
    """

def moe_max_padded_tokens(num_pairs: int, num_experts: int, block_size: int) -> int:
    """Length of sorted_token_ids for moe_align_block_size."""

def moe_align_block_size(topk_ids: NDArray, num_experts: int, block_size: int, sorted_token_ids: NDArray, expert_ids: NDArray, num_tokens_post_pad: NDArray, stream: int = 0) -> None:
    """
    Sorts the (token, slot) pairs by expert into groups padded to block_size.
    """

def moe_grouped_gemm(out: NDArray, a: NDArray, w: NDArray, sorted_token_ids: NDArray, expert_ids: NDArray, num_tokens_post_pad: NDArray, top_k: int, block_size: int, topk_weights: NDArray | None, stream: int = 0) -> None:
    """
    Grouped GEMM over the expert blocks: out[i] = a[i / top_k] . w[expert]^T (* topk_weights[i]).
    """

def lora_shrink(buf: NDArray, x: NDArray, a: NDArray, token_lora_indices: NDArray, stream: int = 0, tiled: bool = False) -> None:
    """
    buf[t] = x[t] . a[token_lora_indices[t]]^T (zeros where the index is -1).
    """

def lora_expand(out: NDArray, buf: NDArray, b: NDArray, token_lora_indices: NDArray, slice_sizes: Sequence[int], stream: int = 0, tiled: bool = False) -> None:
    """
    out[t, n] += buf[t, slice(n)] . b[token_lora_indices[t], n] (rows with index -1 kept).
    """

def quant_int4_gemm(out: NDArray, x: NDArray, qweight: NDArray, scales: NDArray, zeros: NDArray, group_size: int, stream: int = 0) -> None:
    """
    out [M, N] = x [M, K] . W^T with W[n, k] = (q[n, k] - zeros[n, k / G]) * scales[n, k / G] (qweight [N, K / 2] uint8, two 4-bit codes per byte, low nibble first).
    """

def ops_rms_norm(out: NDArray, input: NDArray, weight: NDArray, epsilon: float, weight_offset: float = 0.0, stream: int = 0) -> None:
    """out = input / rms(input) * (weight_offset + weight), row by row."""

def ops_fused_add_rms_norm(input: NDArray, residual: NDArray, weight: NDArray, epsilon: float, weight_offset: float = 0.0, stream: int = 0) -> None:
    """In place: residual += input, then input = rms_norm(residual)."""

def ops_rotary_embedding(positions: NDArray, query: NDArray, key: NDArray | None, cos_sin_cache: NDArray, is_neox: bool, stream: int = 0) -> None:
    """
    Rotates query [T, Hq, D] and key [T, Hk, D] in place by cos_sin_cache[positions].
    """

def ops_act_and_mul(activation: str, out: NDArray, input: NDArray, stream: int = 0) -> None:
    """
    out[..., d] = act(input[..., :d]) * input[..., d:] (act: silu, gelu, gelu_tanh).
    """

def ops_top_k_top_p_threshold(thresholds: NDArray, probs: NDArray, top_k: NDArray, top_p: NDArray, min_p: NDArray, stream: int = 0) -> None:
    """
    Per row of probs, the value above which top-k / top-p / min-p sampling keeps tokens.
    """

def ops_sample_exponential_race(tokens: NDArray, probs: NDArray, thresholds: NDArray, keys: NDArray, stream: int = 0) -> None:
    """
    One token per row of probs (those >= thresholds), by the exponential race keyed by keys.
    """
