"""Group-limited top-k routing of the DeepSeek MoE layers (V2's softmax scores, V3's sigmoid
scores with a per-expert correction bias), as transformers' DeepseekV2TopkRouter /
DeepseekV3TopkRouter compute it.

The experts are split into ``n_group`` equal groups; each token first keeps its ``topk_group``
best groups (a group's score: its best expert's score for V2, the sum of its two best for V3),
then its ``top_k`` best experts among them. The expert weights are the raw scores of the chosen
experts (V3's correction bias steers the choice only), optionally renormalised to sum to one,
times ``routed_scaling_factor``. A few small tensor ops per layer, no host synchronisation (CUDA
graph safe); the router runs in float32 whatever the model dtype, as transformers keeps the
router in float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class GroupedRouting:
    scoring: str  # "softmax" (V2) or "sigmoid" (V3)
    n_group: int  # 1: no group limit (V2's "greedy")
    topk_group: int
    group_score: str  # "max" (V2) or "top2_sum" (V3)
    renormalize: bool
    routed_scaling_factor: float
    correction_bias: bool  # V3 (noaux_tc): e_score_correction_bias added for the choice

    def __post_init__(self) -> None:
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"MoE scoring function {self.scoring!r} is not supported")
        if self.group_score not in ("max", "top2_sum"):
            raise ValueError(f"MoE group score {self.group_score!r} is not supported")
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"topk_group = {self.topk_group} must be in [1, n_group = {self.n_group}]"
            )

    def check_experts(self, num_experts: int, top_k: int) -> None:
        """Refuses shapes the routing cannot split (transformers would fail on them too)."""
        if num_experts % self.n_group:
            raise ValueError(
                f"n_group = {self.n_group} must divide the {num_experts} routed experts"
            )
        per_group = num_experts // self.n_group
        if self.group_score == "top2_sum" and per_group < 2:
            raise ValueError("noaux_tc routing needs at least two experts per group")
        if top_k > self.topk_group * per_group:
            raise ValueError(
                f"num_experts_per_tok = {top_k} exceeds the {self.topk_group * per_group} "
                "experts of the kept groups"
            )


def grouped_topk(
    router_logits: torch.Tensor,
    top_k: int,
    routing: GroupedRouting,
    correction_bias: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] float32 -> (weights [T, top_k] float32, expert ids [T, top_k] int32)."""
    if routing.scoring == "softmax":
        scores = router_logits.softmax(dim=-1)
    else:
        scores = router_logits.sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    if routing.n_group > 1:
        t, e = choice.shape
        grouped = choice.view(t, routing.n_group, e // routing.n_group)
        if routing.group_score == "max":
            group_scores = grouped.max(dim=-1).values
        else:
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
        kept = group_scores.topk(routing.topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        expert_mask = group_mask.unsqueeze(-1).expand_as(grouped).reshape(t, e)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    if routing.routed_scaling_factor != 1.0:
        weights = weights * routing.routed_scaling_factor
    return weights, ids.to(torch.int32)
