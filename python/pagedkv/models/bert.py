"""BERT-family encoders: BERT, RoBERTa and XLM-RoBERTa (bge, e5, bge-reranker checkpoints).

Post-LayerNorm blocks with biases everywhere, GELU MLPs, learned absolute positions (RoBERTa's
numbered from pad_token_id + 1) and token-type embeddings. Attention is non-causal (every token
sees its whole sequence: ModelConfig.attention_spec says causal=False), through the same paged
prefill op as the decoders, so a sequence must be in one forward from its first token (no
chunked prefill, no decode). ``forward`` returns the final hidden states of the batch's tokens;
poolers (CLS, mean, ...) work on them, and ``classify`` is the cross-encoders' head on each
sequence's first ([CLS] / <s>) token: BERT's pooler (dense + tanh) then ``classifier``, RoBERTa's
classification head (dense + tanh + out_proj). Encoders generate nothing: ``compute_logits``
refuses by name.
"""

from __future__ import annotations

from typing import Iterable, Optional, cast

import torch
from torch import nn

from pagedkv.models.attention_backend import AttentionBackend
from pagedkv.models.config import ModelConfig
from pagedkv.models.layers import (
    Embedding,
    LayerNorm,
    activation,
    check_all_loaded,
    load_weights_into,
)
from pagedkv.models.linear import (
    ColumnParallelLinear,
    QKVParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from pagedkv.models.pipeline_stage import is_first_stage, is_last_stage
from pagedkv.models.vocab_embedding import VocabParallelEmbedding

_FUSED = [
    (".attention.self.query.", ".attention.qkv_proj.", 0),
    (".attention.self.key.", ".attention.qkv_proj.", 1),
    (".attention.self.value.", ".attention.qkv_proj.", 2),
]
# Checkpoint prefixes of the encoder under a task head (BertFor*, XLMRobertaFor*).
_BASE_PREFIXES = ("bert.", "roberta.")
# Tensors an encoder checkpoint may carry that serve no pooling task: the masked-LM heads of
# pre-training checkpoints and the position_ids buffer older transformers saved.
_UNUSED = ("cls.", "lm_head.", "embeddings.position_ids")


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.word_embeddings = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        # Small tables looked up by id: every rank holds them whole.
        self.position_embeddings = Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = Embedding(cfg.extra["type_vocab_size"], cfg.hidden_size)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertOutput(nn.Module):
    """``LayerNorm(residual + dense(h))``: the post-norm end of both sublayers (HF's
    BertSelfOutput and BertOutput)."""

    def __init__(self, cfg: ModelConfig, in_features: int) -> None:
        super().__init__()
        self.dense = RowParallelLinear(in_features, cfg.hidden_size, bias=True)
        self.LayerNorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(residual + self.dense(h))


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.act = activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertAttention(nn.Module):
    """Self-attention, then ``LayerNorm(x + dense(attention))`` (post-norm)."""

    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.spec = cfg.attention_spec(layer_idx)
        self.layer_idx = layer_idx
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, bias=True
        )
        self.num_heads = self.qkv_proj.num_heads  # this rank's
        self.output = BertOutput(cfg, cfg.hidden_size)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).view(t, 3, self.num_heads, self.head_dim).unbind(1)
        out = attn.forward(self.layer_idx, q, k, v, self.spec)
        return self.output(out.reshape(t, -1), x)


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.attention = BertAttention(cfg, layer_idx)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, attn: AttentionBackend) -> torch.Tensor:
        x = self.attention(x, attn)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg, i) for i in range(cfg.num_hidden_layers))


class BertPooler(nn.Module):
    """dense + tanh on each sequence's first token."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = ReplicatedLinear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first))


def roberta_positions(
    input_ids: torch.Tensor, positions: torch.Tensor, pad_token_id: int
) -> torch.Tensor:
    """HF's RoBERTa position ids for a flat batch of whole sequences laid end to end
    (``positions`` restart at 0 with each sequence): pad_token_id + the count of non-pad tokens
    up to and including the token within its sequence, and pad_token_id for pad tokens."""
    mask = (input_ids != pad_token_id).to(torch.long)
    inclusive = torch.cumsum(mask, 0)
    start = torch.arange(input_ids.shape[0], device=input_ids.device) - positions.to(torch.long)
    before = (inclusive - mask)[start]  # non-pad tokens of the batch before the sequence
    return (inclusive - before) * mask + pad_token_id


class BertModel(nn.Module):
    """BertModel / BertForSequenceClassification (RoBERTa-style subclasses below)."""

    # What the pooling engine reads: the rows a default pooler (and ``classify``) takes, each
    # sequence's first token (vLLM's default_pooling_type); and that attention is
    # bidirectional (no chunked prefill, no prefix caching).
    pooling_type = "CLS"
    is_causal = False

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if not (is_first_stage() and is_last_stage()):
            raise ValueError(f"{cfg.architecture} does not support pipeline parallelism")
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        # BertModel's pooler; kept only when the checkpoint has it (load_weights), as the
        # cross-encoder's head needs it.
        self.pooler: Optional[BertPooler] = BertPooler(cfg)
        self.classifier: Optional[nn.Module] = self._make_classifier(cfg)

    @property
    def type_vocab_size(self) -> int:
        """How many token types (text-pair segments) forward's token_type_ids may hold."""
        return int(self.config.extra["type_vocab_size"])

    def _make_classifier(self, cfg: ModelConfig) -> Optional[nn.Module]:
        if not cfg.is_classifier:
            return None
        assert cfg.num_labels is not None
        return ReplicatedLinear(cfg.hidden_size, cfg.num_labels, bias=True)

    def _positions(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return positions

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn: AttentionBackend,
        intermediate: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] (whole sequences, positions from 0), token_type_ids [T]
        (segment A = 0 / B = 1 of a text pair; None: all 0) -> final hidden states [T, hidden]."""
        if intermediate is not None:
            raise ValueError(f"{self.config.architecture} runs on a single pipeline stage")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = self.embeddings(input_ids, self._positions(input_ids, positions), token_type_ids)
        for layer in self.encoder.layer:
            x = layer(x, attn)
        return x

    def _pool_first_token(self, first: torch.Tensor) -> torch.Tensor:
        if self.pooler is None:
            raise ValueError(f"the {self.config.architecture} checkpoint has no pooler weights")
        return self.pooler(first)

    @torch.inference_mode()
    def classify(self, first: torch.Tensor) -> torch.Tensor:
        """Final hidden states of each sequence's first token [N, hidden] -> float32 class
        logits [N, num_labels] (HF's ``*ForSequenceClassification`` logits)."""
        if self.classifier is None:
            raise ValueError(
                f"{self.config.architecture} has no classification head; load a "
                "*ForSequenceClassification checkpoint"
            )
        return self.classifier(self._pool_first_token(first)).float()

    def compute_logits(self, hidden: torch.Tensor, upcast: bool = True) -> torch.Tensor:
        raise ValueError(
            f"{self.config.architecture} is an encoder model (embeddings, classification, "
            "scores): it does not generate text"
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def rename(name: str) -> Optional[str]:
            for prefix in _BASE_PREFIXES:
                if name.startswith(prefix):
                    name = name[len(prefix) :]
                    break
            if name.startswith(_UNUSED):
                return None
            # TF-converted checkpoints name LayerNorm's parameters gamma / beta.
            return name.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
                "LayerNorm.beta", "LayerNorm.bias"
            )

        written = load_weights_into(self, weights, _FUSED, rename=rename)
        if not any(name.startswith("pooler.") for name in written):
            self.pooler = None  # a checkpoint without one (RoBERTa classifiers, most encoders)
        check_all_loaded(self, written, {".qkv_proj.": 3})


class _RobertaClassificationHead(nn.Module):
    """dense + tanh + out_proj on the first token (RobertaClassificationHead)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.num_labels is not None
        self.dense = ReplicatedLinear(cfg.hidden_size, cfg.hidden_size, bias=True)
        self.out_proj = ReplicatedLinear(cfg.hidden_size, cfg.num_labels, bias=True)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first)))


class XLMRobertaModel(BertModel):
    """RoBERTa / XLM-RoBERTa (and their *ForSequenceClassification): BERT's blocks, positions
    numbered from pad_token_id + 1, and RoBERTa's classification head."""

    def _make_classifier(self, cfg: ModelConfig) -> Optional[nn.Module]:
        return _RobertaClassificationHead(cfg) if cfg.is_classifier else None

    def _positions(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return roberta_positions(input_ids, positions, int(self.config.extra["pad_token_id"]))

    @torch.inference_mode()
    def classify(self, first: torch.Tensor) -> torch.Tensor:
        if self.classifier is None:
            return super().classify(first)  # the same refusal
        return cast(nn.Module, self.classifier)(first).float()
