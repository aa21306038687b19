"""Poolers: the final hidden states of a prompt's tokens -> what a pooling task returns.

How a model pools comes, by precedence, from the engine's ``pooler_config`` (vLLM's
``--pooler-config`` / ``override_pooler_config``), then from the checkpoint's sentence-
transformers files (``modules.json``: a Pooling module's ``1_Pooling/config.json`` and whether a
Normalize module follows), then from vLLM's defaults: the model's own pooling type (LAST for
decoders, CLS for BERT encoders), normalised embeddings, softmax / sigmoid class scores.

Pooling types: LAST (the last prompt token), CLS (the first), MEAN (all prompt tokens averaged),
ALL (every token's output), STEP (the tokens equal to ``step_tag_id``, for process rewards).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from typing import Any, List, Optional

import torch
import torch.nn.functional as F

from pagedkv.engine.pooling_params import PoolingParams

POOLING_TYPES = ("LAST", "MEAN", "CLS", "ALL", "STEP")
# Per-prompt vector poolers vs per-token ones.
_VECTOR_TYPES = ("LAST", "MEAN", "CLS")
# sentence-transformers' pooling modes -> ours (modes we cannot reproduce are refused by name).
_ST_MODES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
_ST_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


@dataclass
class PoolerConfig:
    """vLLM's PoolerConfig fields that pagedkv honours (None: not set at this level)."""

    pooling_type: Optional[str] = None
    normalize: Optional[bool] = None
    use_activation: Optional[bool] = None
    dimensions: Optional[int] = None
    step_tag_id: Optional[int] = None
    returned_token_ids: Optional[List[int]] = None

    @classmethod
    def from_dict(cls, d: Any, name: str = "pooler_config") -> PoolerConfig:
        if isinstance(d, PoolerConfig):
            return d
        if not isinstance(d, dict):
            raise TypeError(f"{name} must be a dict of PoolerConfig fields, got {type(d).__name__}")
        d = dict(d)
        for old in ("softmax", "activation"):  # vLLM's older names of use_activation
            if old in d:
                d.setdefault("use_activation", d.pop(old))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"{name}: {unknown} not supported; pagedkv's pooler takes {sorted(known)}"
            )
        cfg = cls(**d)
        if cfg.pooling_type is not None:
            cfg.pooling_type = str(cfg.pooling_type).upper()
            if cfg.pooling_type not in POOLING_TYPES:
                raise ValueError(
                    f"{name}: pooling_type must be one of {', '.join(POOLING_TYPES)}, "
                    f"got {d['pooling_type']!r}"
                )
        # The per-request rules check the values (types, ranges).
        PoolingParams(
            dimensions=cfg.dimensions,
            normalize=cfg.normalize,
            use_activation=cfg.use_activation,
            step_tag_id=cfg.step_tag_id,
            returned_token_ids=cfg.returned_token_ids,
        )
        return cfg

    def over(self, base: PoolerConfig) -> PoolerConfig:
        """This config's set fields over ``base``'s."""
        out = PoolerConfig(**{f.name: getattr(base, f.name) for f in fields(self)})
        for f in fields(self):
            if getattr(self, f.name) is not None:
                setattr(out, f.name, getattr(self, f.name))
        return out


def sentence_transformers_config(directory: Optional[str]) -> PoolerConfig:
    """The pooling a sentence-transformers folder declares (empty if it is not one)."""
    if directory is None:
        return PoolerConfig()
    path = os.path.join(directory, "modules.json")
    if not os.path.isfile(path):
        return PoolerConfig()
    with open(path, encoding="utf-8") as f:
        modules = json.load(f)
    out = PoolerConfig(normalize=False)
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            out.pooling_type = _st_pooling_type(os.path.join(directory, module.get("path", "")))
        elif kind == "Normalize":
            out.normalize = True
        elif kind not in ("Transformer", "StaticEmbedding"):
            raise ValueError(
                f"sentence-transformers module {module.get('type')!r} ({module.get('path')}) is "
                "not supported: pagedkv pools and normalises only (no Dense / other modules)"
            )
    return out


def _st_pooling_type(folder: str) -> str:
    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    if cfg.get("include_prompt") is False:
        raise ValueError("sentence-transformers pooling with include_prompt=False is not supported")
    if "pooling_mode" in cfg:  # sentence-transformers >= 5 writes one mode
        modes = cfg["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        modes = [mode for key, mode in _ST_FLAGS.items() if cfg.get(key)]
    ours = [_ST_MODES.get(m.lower(), m) if m.lower() in _ST_MODES else m for m in modes]
    if len(ours) != 1 or ours[0] not in _VECTOR_TYPES:
        raise ValueError(
            f"sentence-transformers pooling mode {modes} is not supported; supported: one of "
            f"{sorted(_ST_MODES)}"
        )
    return ours[0]


def _hf_config(directory: Optional[str]) -> dict:
    if directory is None or not os.path.isfile(os.path.join(directory, "config.json")):
        return {}
    with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
        return dict(json.load(f))


def matryoshka_info(d: dict) -> tuple[bool, Optional[List[int]]]:
    """(the model was trained for Matryoshka truncation, the sizes its config lists)."""
    dims = d.get("matryoshka_dimensions")
    return bool(d.get("is_matryoshka") or dims), (list(dims) if dims else None)


class Pooler:
    """Pools one engine's requests. ``model``: the pooling model (its ``pooling_type``,
    ``classify`` and config); ``config``: the merged PoolerConfig."""

    def __init__(self, model: Any, config: PoolerConfig, directory: Optional[str]) -> None:
        self.model = model
        self.config = config
        self.default_type = str(getattr(model, "pooling_type", "LAST"))
        self.is_classifier = bool(model.config.is_classifier)
        self.num_labels = int(model.config.num_labels or 0)
        hf = _hf_config(directory)
        self.is_matryoshka, self.matryoshka_dims = matryoshka_info(hf)
        # Class names of a classifier's outputs (config.json's id2label), for /classify.
        labels = hf.get("id2label") or {}
        self.id2label = {int(k): str(v) for k, v in labels.items()}

    # ------------------------------------------------------------------ what a task needs
    def pooling_type(self, task: str) -> str:
        t = self.config.pooling_type
        if task in ("reward", "encode"):
            return t if t in ("ALL", "STEP") else "ALL"
        if t is None or t not in _VECTOR_TYPES:
            return self.default_type
        return t

    def rows(self, task: str) -> str:
        """Which prompt rows the task reads: "first", "last" or "all"."""
        t = self.pooling_type(task)
        return {"CLS": "first", "LAST": "last"}.get(t, "all")

    def check(self, task: str, params: PoolingParams) -> None:
        """Refuses a request the model cannot serve (before it reaches the engine)."""
        params.verify(task, self.matryoshka_dims, self.is_matryoshka)
        width = int(self.model.config.hidden_size)
        if params.dimensions is not None and params.dimensions > width:
            # Truncation cannot widen: a larger value was returned at full width, unnoticed.
            raise ValueError(
                f"dimensions={params.dimensions} exceeds the model's embedding size {width}"
            )
        if task in ("classify", "score") and not self.is_classifier:
            raise ValueError(
                f"task {task!r} needs a sequence-classification model (a "
                "*ForSequenceClassification checkpoint with a score / classifier head); "
                f"{self.model.config.architecture} has none"
            )
        if task == "score" and self.num_labels != 1:
            raise ValueError(
                f"score needs a cross-encoder with one output label, this model has "
                f"{self.num_labels}; use classify for its class scores"
            )
        step_only = [
            n for n in ("step_tag_id", "returned_token_ids") if getattr(params, n) is not None
        ]
        if step_only and self.pooling_type(task) != "STEP":
            raise ValueError(
                f"{step_only[0]} applies to STEP pooling; this model pools {task!r} with "
                f"{self.pooling_type(task)} (set pooler_config={{'pooling_type': 'STEP'}})"
            )
        wanted = params.returned_token_ids or self.config.returned_token_ids
        if wanted is not None and task in ("reward", "encode"):
            width = (
                self.num_labels
                if task == "reward" and self.is_classifier
                else int(self.model.config.hidden_size)
            )
            if max(wanted) >= width:
                raise ValueError(
                    f"returned_token_ids must be < {width} (the outputs per token), "
                    f"got {max(wanted)}"
                )

    def step_tag_id(self, params: PoolingParams) -> Optional[int]:
        return params.step_tag_id if params.step_tag_id is not None else self.config.step_tag_id

    # ------------------------------------------------------------------ pooling
    @torch.inference_mode()
    def pool(
        self,
        tasks: List[str],
        rows: List[torch.Tensor],
        token_ids: List[List[int]],
        params: List[PoolingParams],
    ) -> List[torch.Tensor]:
        """Finished requests -> their outputs (float32, CPU). ``rows[i]``: the hidden states
        that request ``i``'s pooling type reads (its rows(task) of the prompt, in order).
        Requests alike (task, dimensions, normalize / activation) share one batched head."""
        out: List[Optional[torch.Tensor]] = [None] * len(tasks)
        groups: dict[tuple, List[int]] = {}
        for i, task in enumerate(tasks):
            if self.pooling_type(task) in _VECTOR_TYPES:
                groups.setdefault(self._head_key(task, params[i]), []).append(i)
            else:
                out[i] = self._token_head(task, rows[i], token_ids[i], params[i]).cpu()
        for (task, dims, flag), idx in groups.items():
            kind = self.pooling_type(task)
            pooled = torch.stack([self._vector(kind, rows[i]) for i in idx])
            done = self._vector_head(task, pooled, dims, flag).cpu()
            for j, i in enumerate(idx):
                out[i] = done[j]
        return [o for o in out if o is not None]

    def _head_key(self, task: str, p: PoolingParams) -> tuple:
        if task in ("classify", "score"):
            return task, None, self._activation(p, True)
        dims = p.dimensions if p.dimensions is not None else self.config.dimensions
        return task, dims, self._normalize(p, True)

    @staticmethod
    def _vector(kind: str, rows: torch.Tensor) -> torch.Tensor:
        if kind == "MEAN":
            return rows.float().mean(dim=0).to(rows.dtype)
        return rows[-1] if kind == "LAST" else rows[0]

    def _vector_head(
        self, task: str, pooled: torch.Tensor, dims: Optional[int], flag: bool
    ) -> torch.Tensor:
        """[N, hidden] pooled states -> [N, ...]: class scores (``flag``: activation) for
        classify / score, else embeddings cut to ``dims`` (Matryoshka: before normalising, as
        vLLM does), normalised when ``flag``."""
        if task in ("classify", "score"):
            scores = self._activate(self.model.classify(pooled).float(), flag)
            return scores[:, :1] if task == "score" else scores
        x = pooled.float()
        if dims is not None:
            x = x[:, :dims]
        return F.normalize(x, dim=-1) if flag else x

    def _token_head(
        self, task: str, rows: torch.Tensor, token_ids: List[int], params: PoolingParams
    ) -> torch.Tensor:
        kind = self.pooling_type(task)
        tag = self.step_tag_id(params)
        if task == "reward" and self.is_classifier:
            x = self.model.classify(rows).float()
        else:
            x = rows.float()
        if kind == "STEP":
            if tag is not None:
                keep = torch.tensor(token_ids, device=x.device) == tag
                x = x[keep]
            wanted = params.returned_token_ids or self.config.returned_token_ids
            if wanted is not None:  # (bounded by check())
                x = x[:, wanted]
        if task == "reward":
            x = self._activate(x, self._activation(params, kind == "STEP"))
        elif params.normalize:  # per-token outputs: normalised only when asked
            x = F.normalize(x, dim=-1)
        return x

    # ------------------------------------------------------------------ heads
    def _normalize(self, p: PoolingParams, default: bool) -> bool:
        if p.normalize is not None:
            return p.normalize
        return self.config.normalize if self.config.normalize is not None else default

    def _activation(self, p: PoolingParams, default: bool) -> bool:
        if p.use_activation is not None:
            return p.use_activation
        c = self.config.use_activation
        return c if c is not None else default

    @staticmethod
    def _activate(x: torch.Tensor, on: bool) -> torch.Tensor:
        """Class scores: sigmoid for one label, softmax over several (vLLM's and
        sentence-transformers' CrossEncoder defaults)."""
        if not on:
            return x
        return torch.sigmoid(x) if x.shape[-1] == 1 else torch.softmax(x, dim=-1)
