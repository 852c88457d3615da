"""Transformers on token ids: BERT-base and -large (encoder) and GPT-2 124M (decoder).

One block serves both: BERT normalises after each residual add (post-norm),
GPT-2 before (pre-norm) and masks attention causally. Attention runs through
``F.scaled_dot_product_attention`` in its own parameter-free module
(``attention.core``), so a model description sees it as one layer with two
batched matrix multiplies, as a fused GPU kernel runs it.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

BERT_VOCAB, BERT_POSITIONS = 30522, 512          # bert-base-uncased's WordPiece vocabulary
GPT2_VOCAB, GPT2_CONTEXT = 50257, 1024           # GPT-2's byte-level BPE vocabulary


class AttentionCore(nn.Module):
    """softmax(Q·Kᵀ/√d)·V over (batch, heads, tokens, head width) tensors; no parameters."""

    def __init__(self, causal: bool, dropout: float):
        super().__init__()
        self.causal, self.dropout = causal, dropout

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                              is_causal=self.causal)


class SelfAttention(nn.Module):
    """Multi-head self-attention: Q, K, V projections (three, or ``fused`` into one as GPT-2's), core, output projection."""

    def __init__(self, width: int, heads: int, causal: bool, fused: bool, dropout: float):
        super().__init__()
        self.heads = heads
        if fused:
            self.qkv = nn.Linear(width, 3 * width)
        else:
            self.query, self.key, self.value = (nn.Linear(width, width) for _ in range(3))
        self.core = AttentionCore(causal, dropout)
        self.proj = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        if hasattr(self, "qkv"):
            q, k, v = self.qkv(x).split(width, dim=2)
        else:
            q, k, v = self.query(x), self.key(x), self.value(x)
        q, k, v = (t.view(batch, tokens, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        out = self.core(q, k, v).transpose(1, 2).reshape(batch, tokens, width)
        return self.dropout(self.proj(out))


class FeedForward(nn.Sequential):
    """width → hidden → width with GELU (GPT-2 uses the tanh approximation). A plain ``nn.Sequential``, so
    :func:`gpurig.krizhevsky_plan` can split ``fc`` by columns and ``proj`` by rows (Megatron-LM's MLP split).

    >>> [name for name, _ in FeedForward(8, 32, 0.1).named_children()]
    ['fc', 'act', 'proj', 'dropout']
    """

    def __init__(self, width: int, hidden: int, dropout: float, gelu: str = "none"):
        super().__init__(OrderedDict(fc=nn.Linear(width, hidden), act=nn.GELU(approximate=gelu),
                                     proj=nn.Linear(hidden, width), dropout=nn.Dropout(dropout)))


class Block(nn.Module):
    """A transformer layer: attention and feed-forward, each with a residual add and a LayerNorm."""

    def __init__(self, width: int, heads: int, *, causal: bool, pre_norm: bool, fused_qkv: bool, dropout: float,
                 gelu: str, eps: float):
        super().__init__()
        self.pre_norm = pre_norm
        self.attention_norm = nn.LayerNorm(width, eps=eps)
        self.attention = SelfAttention(width, heads, causal, fused_qkv, dropout)
        self.mlp_norm = nn.LayerNorm(width, eps=eps)
        self.mlp = FeedForward(width, 4 * width, dropout, gelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))
        x = self.attention_norm(x + self.attention(x))
        return self.mlp_norm(x + self.mlp(x))


class Embeddings(nn.Module):
    """Token + learned position (+ BERT's segment) embeddings, optionally normalised, then dropout."""

    def __init__(self, vocab: int, positions: int, width: int, *, segments: int, norm: bool, dropout: float):
        super().__init__()
        self.word, self.position = nn.Embedding(vocab, width), nn.Embedding(positions, width)
        self.segment = nn.Embedding(segments, width) if segments else None
        self.norm = nn.LayerNorm(width, eps=1e-12) if norm else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.word(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        if self.segment is not None:
            x = x + self.segment(torch.zeros_like(ids))   # every token in segment A
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x)


class Bert(nn.Module):
    """BERT's encoder with embeddings and the [CLS] pooler (no pre-training heads); returns (tokens, pooled)."""

    def __init__(self, width: int, layers: int, heads: int, vocab: int = BERT_VOCAB, positions: int = BERT_POSITIONS,
                 dropout: float = 0.1):
        super().__init__()
        self.embeddings = Embeddings(vocab, positions, width, segments=2, norm=True, dropout=dropout)
        self.layers = nn.Sequential(*(Block(width, heads, causal=False, pre_norm=False, fused_qkv=False,
                                            dropout=dropout, gelu="none", eps=1e-12) for _ in range(layers)))
        self.pooler = nn.Sequential(nn.Linear(width, width), nn.Tanh())

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.layers(self.embeddings(ids))
        return tokens, self.pooler(tokens[:, 0])


class GPT2(nn.Module):
    """GPT-2: pre-norm causal decoder; the output layer shares the token embedding's weights."""

    def __init__(self, width: int = 768, layers: int = 12, heads: int = 12, vocab: int = GPT2_VOCAB,
                 context: int = GPT2_CONTEXT, dropout: float = 0.1):
        super().__init__()
        self.embeddings = Embeddings(vocab, context, width, segments=0, norm=False, dropout=dropout)
        self.layers = nn.Sequential(*(Block(width, heads, causal=True, pre_norm=True, fused_qkv=True,
                                            dropout=dropout, gelu="tanh", eps=1e-5) for _ in range(layers)))
        self.norm = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.embeddings.word.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.layers(self.embeddings(ids))))


def bert_base() -> nn.Module:
    """BERT-base: 12 layers, width 768, 12 heads; 109,482,240 parameters with the pooler.

    >>> with torch.device("meta"):  # shapes only: no memory, no initialisation
    ...     model = bert_base()
    >>> sum(p.numel() for p in model.parameters())
    109482240
    """
    return Bert(768, 12, 12)


def bert_large() -> nn.Module:
    """BERT-large: 24 layers, width 1024, 16 heads; 335,141,888 parameters with the pooler.

    >>> with torch.device("meta"):
    ...     model = bert_large()
    >>> sum(p.numel() for p in model.parameters())
    335141888
    """
    return Bert(1024, 24, 16)


def gpt2() -> nn.Module:
    """GPT-2 124M: 12 layers, width 768, 12 heads, 1024-token context, tied input/output embeddings.

    >>> with torch.device("meta"):
    ...     model = gpt2()
    >>> sum(p.numel() for p in model.parameters()), model(torch.zeros(1, 8, dtype=torch.long)).shape
    (124439808, torch.Size([1, 8, 50257]))
    """
    return GPT2()
