"""Mixture-of-experts layers (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3) over the fused MoE
ops.

The experts of a layer are stacked tensors, ``w13_weight`` [E, 2 * I, H] (each expert's gate
rows, then its up rows) and ``w2_weight`` [E, H, I], so one grouped GEMM per projection runs
every expert at once (pagedkv.ops.moe_grouped_gemm), never a Python loop over experts. Each
stacked parameter has a ``weight_loader(param, tensor, expert_id, shard)`` that places one
checkpoint expert (an expert-parallel layer can override it to keep its own experts).

Under tensor parallelism every rank holds every expert's slice of the intermediate dimension
(Megatron's split inside each expert: gate/up rows and down columns, I / tp each), so the
routing is the same on all ranks and one all-reduce sums the experts' partial outputs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from pagedkv import moe_ops
from pagedkv.distributed import get_tp_group
from pagedkv.models.layers import act_and_mul
from pagedkv.models.linear import (
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from pagedkv.models.moe_routing import GroupedRouting

# HF architectures with sparse MoE layers and the experts' normalisation rule.
MOE_ARCHITECTURES = (
    "MixtralForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM",
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
)
_DEEPSEEK = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of each expert
    # Mixtral: always (a softmax over the top-k logits); Qwen: the config's norm_topk_prob.
    renormalize: bool
    decoder_sparse_step: int = 1  # Qwen: every step-th layer is sparse
    mlp_only_layers: tuple[int, ...] = ()  # Qwen: layers that stay dense
    # Qwen2-MoE: one always-on expert, sigmoid-gated; DeepSeek: n_shared_experts of them fused
    # into one MLP, ungated.
    shared_expert_intermediate_size: int = 0
    # DeepSeek: group-limited routing (moe_routing.py) instead of a softmax over the top-k.
    routing: Optional[GroupedRouting] = None

    def is_sparse(self, layer_idx: int) -> bool:
        return (
            layer_idx not in self.mlp_only_layers
            and (layer_idx + 1) % self.decoder_sparse_step == 0
        )

    @classmethod
    def from_hf_dict(cls, arch: str, d: dict[str, Any]) -> Optional[MoEConfig]:
        """The MoE fields of a config.json, None for a dense architecture."""
        if arch == "MixtralForCausalLM":
            return cls(
                num_experts=d["num_local_experts"],
                top_k=d["num_experts_per_tok"],
                intermediate_size=d["intermediate_size"],
                renormalize=True,
            )
        if arch in ("Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
            # The hub's Qwen checkpoints write num_experts; transformers >= 5 saves Qwen3-MoE's
            # as num_local_experts (its attribute_map maps one name to the other).
            experts = d["num_local_experts"] if "num_local_experts" in d else d["num_experts"]
            return cls(
                num_experts=experts,
                top_k=d["num_experts_per_tok"],
                intermediate_size=d["moe_intermediate_size"],
                renormalize=bool(d.get("norm_topk_prob", arch != "Qwen2MoeForCausalLM")),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
                shared_expert_intermediate_size=int(d.get("shared_expert_intermediate_size") or 0),
            )
        if arch in _DEEPSEEK:
            return _deepseek_moe(arch, d)
        return None


def _deepseek_moe(arch: str, d: dict[str, Any]) -> MoEConfig:
    """DeepSeek-V2 (softmax scores; "greedy" or "group_limited_greedy") and V3 ("noaux_tc":
    sigmoid scores, a correction bias, groups scored by their two best experts); dense MLPs on
    the first first_k_dense_replace layers. Keys transformers ignores but the original DeepSeek
    code honours are refused where they would change the answer."""
    v3 = arch == "DeepseekV3ForCausalLM"
    method = d.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    methods = ("noaux_tc",) if v3 else ("greedy", "group_limited_greedy")
    if method not in methods:
        raise ValueError(f"config.json: {arch} with topk_method {method!r} is not supported")
    scoring = d.get("scoring_func") or ("sigmoid" if v3 else "softmax")
    if scoring != ("sigmoid" if v3 else "softmax"):
        raise ValueError(f"config.json: {arch} with scoring_func {scoring!r} is not supported")
    if int(d.get("moe_layer_freq") or 1) != 1:
        raise ValueError(f"config.json: {arch} with moe_layer_freq != 1 is not supported")
    renormalize = bool(d.get("norm_topk_prob", v3))
    if renormalize and not v3:
        # transformers' DeepSeek-V2 router never renormalises; the original code does.
        raise ValueError(
            "config.json: DeepseekV2ForCausalLM with norm_topk_prob true is not supported"
        )
    grouped = method != "greedy"
    experts = d.get("n_routed_experts") or d.get("num_experts") or d["num_local_experts"]
    routing = GroupedRouting(
        scoring=scoring,
        n_group=int(d["n_group"]) if grouped else 1,
        topk_group=int(d["topk_group"]) if grouped else 1,
        group_score="top2_sum" if v3 else "max",
        renormalize=renormalize,
        routed_scaling_factor=float(d.get("routed_scaling_factor", 2.5 if v3 else 1.0)),
        correction_bias=v3,
    )
    top_k = int(d["num_experts_per_tok"])
    routing.check_experts(int(experts), top_k)
    moe_inter = int(d["moe_intermediate_size"])
    return MoEConfig(
        num_experts=int(experts),
        top_k=top_k,
        intermediate_size=moe_inter,
        renormalize=renormalize,
        mlp_only_layers=tuple(range(int(d.get("first_k_dense_replace") or 0))),
        shared_expert_intermediate_size=moe_inter * int(d.get("n_shared_experts") or 0),
        routing=routing,
    )


# fused_experts' kernels: "pagedkv" is the core's grouped GEMM (include/pagedkv/moe.h, every
# device and dtype); "grouped_mm" is torch's CUTLASS grouped GEMM (torch._grouped_mm, bf16 on
# Hopper), which the H200 benchmark measured several times faster (benchmarks/RESULTS.md, "MoE").
MOE_KERNELS = ("auto", "pagedkv", "grouped_mm")

# "auto" where grouped_mm applies takes the core's kernel for a many-expert layer whose experts
# mostly get no row at all (fine-grained MoE decode at small batches): grouped_mm's cost grows
# with the expert count (a group per expert, used or not), the core's with the rows. H200,
# 8636d35, `benchmarks/moe.py --skip-engine --skip-hf-loop --shape qwen3-30b-a3b` (RESULTS.md
# "MoE"), us per layer, core vs grouped_mm, Qwen3-30B-A3B (128 experts, top-8): 453 vs 651 at 1
# token (0.06 rows per expert), 897 vs 725 at 16 (1 row per expert), 1158 vs 896 at 64, 1492 vs
# 934 at 256: the crossover lies between 1 and 16 tokens, 2-8 not measured; the rule splits it
# at a quarter row per expert. Mixtral-8x7B (8 large experts, top-2): grouped_mm even at 1 token.
MOE_CORE_MIN_EXPERTS = 64
MOE_CORE_MAX_ROWS_PER_EXPERT = 0.25


def auto_moe_kernel(num_tokens: int, top_k: int, num_experts: int) -> str:
    """The kernel "auto" runs where both apply (shapes only: fixed per captured CUDA graph)."""
    if (
        num_experts >= MOE_CORE_MIN_EXPERTS
        and num_tokens * top_k <= MOE_CORE_MAX_ROWS_PER_EXPERT * num_experts
    ):
        return "pagedkv"
    return "grouped_mm"


def _grouped_mm_applies(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> bool:
    """torch._grouped_mm's conditions: a CUDA bf16 problem on sm90+, 16-byte aligned rows."""
    return (
        hasattr(torch, "_grouped_mm")
        and x.is_cuda
        and x.dtype == w13.dtype == w2.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(x.device) >= (9, 0)
        and x.shape[-1] % 8 == 0
        and w2.shape[-1] % 8 == 0
    )


def _experts_grouped_mm(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: str,
) -> torch.Tensor:
    """fused_experts through torch._grouped_mm: the (token, slot) pairs sorted by expert, one
    grouped GEMM per projection over per-expert row ranges (offsets stay on the device: no host
    sync, CUDA-graph safe), the weighted rows put back in pair order and summed per token in a
    fixed order (deterministic, unlike an index_add)."""
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    expert_of, order = torch.sort(flat, stable=True)
    # Each expert's end row in the sorted pairs. (Not a bincount: on CUDA it reads the
    # input's max on the host, which a CUDA graph cannot capture.)
    experts = torch.arange(w13.shape[0], device=flat.device)
    offs = torch.searchsorted(expert_of, experts, right=True).to(torch.int32)
    h = torch._grouped_mm(x[order // k], w13.transpose(1, 2), offs=offs)  # [T*k, 2I]
    y = torch._grouped_mm(act_and_mul(act)(h), w2.transpose(1, 2), offs=offs)  # [T*k, H]
    y = y * topk_weights.reshape(-1)[order].to(y.dtype).unsqueeze(1)
    pairs = torch.empty_like(y)
    pairs[order] = y
    return pairs.view(t, k, -1).sum(dim=1)


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act: str = "silu",
    kernel: str = "auto",
) -> torch.Tensor:
    """x [T, H] through each token's top-k experts, weighted and summed -> [T, H]. ``kernel``:
    one of MOE_KERNELS; "auto" takes grouped_mm where it applies, but for the shapes
    auto_moe_kernel gives the core's kernel, else pagedkv."""
    if kernel not in MOE_KERNELS:
        raise ValueError(f"kernel must be one of {MOE_KERNELS}, got {kernel!r}")
    t, k = topk_ids.shape
    if kernel == "auto" and _grouped_mm_applies(x, w13, w2):
        kernel = auto_moe_kernel(t, k, w13.shape[0])
    if kernel == "grouped_mm":
        return _experts_grouped_mm(x, w13, w2, topk_weights, topk_ids, act)
    num_experts = w13.shape[0]
    block = moe_ops.moe_block_size(t * k, num_experts)
    sorted_ids, expert_ids, used = moe_ops.moe_align_block_size(topk_ids, block, num_experts)
    h = moe_ops.moe_grouped_gemm(x, w13, sorted_ids, expert_ids, used, k, block)  # [T*k, 2I]
    h = act_and_mul(act)(h)  # [T*k, I]
    y = moe_ops.moe_grouped_gemm(
        h, w2, sorted_ids, expert_ids, used, 1, block, topk_weights
    )  # [T*k, H], weighted
    return y.view(t, k, -1).sum(dim=1)


class FusedMoE(nn.Module):
    """The experts of one layer as stacked weights, routed by the router logits."""

    def __init__(self, moe: MoEConfig, hidden_size: int, hidden_act: str) -> None:
        super().__init__()
        tp = get_tp_group()
        if moe.intermediate_size % tp.world_size:
            raise ValueError(
                f"the experts' intermediate size ({moe.intermediate_size}) is not "
                f"divisible by tensor_parallel_size {tp.world_size}"
            )
        e, inter = moe.num_experts, moe.intermediate_size // tp.world_size  # this rank's slice
        self.tp_rank = tp.rank_in_group
        self.top_k, self.renormalize, self.act = moe.top_k, moe.renormalize, hidden_act
        act_and_mul(hidden_act)  # an unknown activation is refused when the model is built
        self.w13_weight = nn.Parameter(torch.empty(e, 2 * inter, hidden_size), requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(e, hidden_size, inter), requires_grad=False)
        for p in (self.w13_weight, self.w2_weight):
            p.weight_loader = self.weight_loader  # type: ignore[attr-defined]

    def weight_loader(
        self,
        param: torch.Tensor,
        tensor: torch.Tensor,
        expert_id: Optional[int],
        shard: Optional[int],
    ) -> None:
        """One expert's checkpoint matrix into ``param``: shard 0 / 1 = gate / up rows of
        w13_weight, shard 2 = w2_weight; expert_id None: every expert's, stacked as transformers
        5 holds them (gate_up_proj [E, 2I, H] with gate rows first, down_proj [E, H, I]).
        Each rank keeps its slice of the intermediate dimension."""
        dst = param.data if expert_id is None else param.data[expert_id]
        rows = dst.dim() - 2  # the expert's [out, in] dims (after the stacked expert dim)
        if shard is None and expert_id is None and get_tp_group().world_size > 1:
            half = tensor.shape[rows] // 2  # gate rows, then up rows: each sliced alike
            for part in (0, 1):
                self.weight_loader(param, tensor.narrow(rows, part * half, half), None, part)
            return
        if shard in (0, 1):
            half = dst.shape[rows] // 2
            dst = dst.narrow(rows, shard * half, half)
        # The intermediate dimension: rows of gate/up, columns of down.
        dim = rows + 1 if shard == 2 else rows
        local = dst.shape[dim]
        if tensor.dim() == dst.dim() and tensor.shape[dim] == local * get_tp_group().world_size:
            tensor = tensor.narrow(dim, self.tp_rank * local, local)
        if tuple(dst.shape) != tuple(tensor.shape):
            raise ValueError(f"has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
        with torch.no_grad():
            dst.copy_(tensor.to(dst.dtype))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = moe_ops.topk_softmax(router_logits, self.top_k, self.renormalize)
        return self.routed(x, weights, ids)

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x [T, H] through the experts ``ids`` [T, k] (int32) chosen by a routing of the
        caller's, weighted by ``weights`` [T, k] float32."""
        out = fused_experts(x, self.w13_weight, self.w2_weight, weights, ids, self.act)
        return get_tp_group().all_reduce(out)  # the ranks' intermediate slices summed


class GatedMLP(nn.Module):
    """A dense gated MLP with fused gate/up rows (Qwen2-MoE's shared expert, DeepSeek's shared
    experts and dense layers)."""

    def __init__(
        self, hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool = False
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)
        self.act_and_mul = act_and_mul(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_and_mul(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """Router (``gate``) + experts, plus Qwen2-MoE's sigmoid-gated shared expert."""

    def __init__(self, moe: MoEConfig, hidden_size: int, hidden_act: str) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, moe.num_experts, bias=False)
        self.experts = FusedMoE(moe, hidden_size, hidden_act)
        self.shared_expert: Optional[GatedMLP] = None
        self.shared_expert_gate: Optional[ReplicatedLinear] = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(
                hidden_size, moe.shared_expert_intermediate_size, hidden_act
            )
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.experts(x, self.gate(x))
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out


def sparse_moe_block(cfg: Any, layer_idx: int) -> Optional[SparseMoeBlock]:
    """The MoE block of layer ``layer_idx`` of a ModelConfig, None where the layer is dense."""
    moe: Optional[MoEConfig] = getattr(cfg, "moe", None)
    if moe is None or not moe.is_sparse(layer_idx):
        return None
    return SparseMoeBlock(moe, cfg.hidden_size, cfg.hidden_act)


# ------------------------------------------------------------------------- checkpoint loading
# model.layers.{L}.mlp.experts.{e}.{w1|w3|w2|gate_proj|up_proj|down_proj}.weight
_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(w1|w3|w2|gate_proj|up_proj|down_proj)\.weight$")
_SHARDS = {"w1": 0, "gate_proj": 0, "w3": 1, "up_proj": 1, "w2": 2, "down_proj": 2}
# model.layers.{L}.mlp.experts.{gate_up_proj|down_proj}: every expert at once (transformers 5)
_STACKED = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")


def canonical_name(name: str) -> str:
    """Checkpoint names as our modules spell them (Mixtral's block_sparse_moe is ``mlp``)."""
    return name.replace(".block_sparse_moe.", ".mlp.")


def split_expert_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], written: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Loads the per-expert tensors of ``weights`` into the stacked FusedMoE parameters (adding
    each complete parameter's name to ``written``) and yields every other tensor, renamed by
    canonical_name."""
    from pagedkv.models.pipeline_stage import other_stage_prefixes

    params = dict(model.named_parameters())
    elsewhere = other_stage_prefixes(model)
    seen: dict[str, set[tuple[int, Optional[int]]]] = {}
    for ckpt_name, tensor in weights:
        name = canonical_name(ckpt_name)
        m, stacked = _EXPERT.match(name), _STACKED.match(name)
        expert: Optional[int]
        shard: Optional[int]
        if m is not None:
            prefix, expert, shard = m.group(1), int(m.group(2)), _SHARDS[m.group(3)]
        elif stacked is not None:
            prefix, expert = stacked.group(1), None
            shard = 2 if stacked.group(2) == "down_proj" else None
        else:
            yield name, tensor
            continue
        target = f"{prefix}.{'w2_weight' if shard == 2 else 'w13_weight'}"
        if target not in params and elsewhere and target.startswith(elsewhere):
            continue  # a layer of another pipeline stage
        if target not in params:
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} has no place in the model (looked for {target!r})"
            )
        param = params[target]
        if expert is not None and not 0 <= expert < param.shape[0]:
            raise ValueError(
                f"checkpoint tensor {ckpt_name!r} names expert {expert} but the "
                f"layer has {param.shape[0]} experts"
            )
        try:
            param.weight_loader(param, tensor, expert, shard)  # type: ignore[attr-defined]
        except ValueError as e:
            raise ValueError(f"checkpoint tensor {ckpt_name!r} {e}") from None
        got = seen.setdefault(target, set())
        if expert is None:  # all of them
            got.update((e, s) for e in range(param.shape[0]) for s in ((2,) if shard else (0, 1)))
        else:
            got.add((expert, shard))
        if len(got) == param.shape[0] * (1 if shard == 2 else 2):
            written.add(target)


__all__ = [
    "MOE_ARCHITECTURES",
    "MoEConfig",
    "FusedMoE",
    "SparseMoeBlock",
    "fused_experts",
    "MOE_KERNELS",
    "auto_moe_kernel",
    "sparse_moe_block",
    "split_expert_weights",
    "canonical_name",
]
