"""Transformer-XL on WikiText-103, as NVIDIA DeepLearningExamples' PyTorch code trains it (and Lambda benchmarks it).

What a step runs, layer by layer: the segment's token embedding (scaled by √d)
and sinusoidal relative positions over the segment plus its memory; in each of
the post-norm layers, Q, K and V projected from memory and segment together,
the relative-position keys, two score products (content, position), the
relative shift, the causal mask, softmax, the value product, the output
projection, then a ReLU feed-forward; last, logits over the whole 267,735-word
vocabulary with the embedding's weights (tied) and the cross-entropy over them.

The memory is the previous segment's hidden states, as long as the segment
(``mem_len = tgt_len``, both published configurations), held without gradient.
Lambda's runs use a full softmax (``adaptive=False``, ``div_val=1``): the
vocabulary's logits are computed for every token, which is most of a step.
Parameter counts equal the logs' ``n_all_param`` (Lambda's deeplearning-benchmark,
``pytorch/results/1080Ti/PyTorch_transformerxl*_FP16``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

WT103_VOCAB = 267_735     # WikiText-103's word vocabulary (the logs' n_token)


class RelativeAttention(nn.Module):
    """Multi-head attention with Transformer-XL's relative positions over memory + segment, then add & norm.

    Works in (tokens, batch, heads, width) order as the reference code does, so the relative
    shift is a pad and a view, not a copy of the scores.
    """

    def __init__(self, width: int, heads: int, head_width: int, dropout: float, attention_dropout: float):
        super().__init__()
        self.heads, self.head_width = heads, head_width
        self.qkv = nn.Linear(width, 3 * heads * head_width, bias=False)
        self.position = nn.Linear(width, heads * head_width, bias=False)
        self.out = nn.Linear(heads * head_width, width, bias=False)
        self.dropout, self.attention_dropout = nn.Dropout(dropout), nn.Dropout(attention_dropout)
        self.norm = nn.LayerNorm(width)
        self.scale = 1 / math.sqrt(head_width)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, positions: torch.Tensor, content_bias: torch.Tensor,
                position_bias: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        segment, batch = x.shape[:2]
        span = segment + memory.shape[0]
        q, k, v = self.qkv(torch.cat([memory, x], 0)).chunk(3, dim=-1)
        q = q[-segment:].view(segment, batch, self.heads, self.head_width)
        k, v = (t.view(span, batch, self.heads, self.head_width) for t in (k, v))
        r = self.position(positions).view(span, self.heads, self.head_width)
        content = torch.einsum("ibnd,jbnd->ijbn", q + content_bias, k)
        position = _shift(torch.einsum("ibnd,jnd->ijbn", q + position_bias, r))
        scores = ((content + position) * self.scale).masked_fill(mask[:, :, None, None], -6e4)
        weights = self.attention_dropout(F.softmax(scores, dim=1))
        attended = torch.einsum("ijbn,jbnd->ibnd", weights, v).reshape(segment, batch, self.heads * self.head_width)
        return self.norm(x + self.dropout(self.out(attended)))


def _shift(scores: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's relative shift: row i's scores move left by (rows − 1 − i), through a zero column."""
    rows, cols = scores.shape[:2]
    padded = torch.cat([scores.new_zeros((rows, 1, *scores.shape[2:])), scores], 1)
    return padded.view(cols + 1, rows, *scores.shape[2:])[1:].view_as(scores)


class FeedForward(nn.Module):
    """width → inner → width with ReLU and dropout, then add & norm (post-norm)."""

    def __init__(self, width: int, inner: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, inner), nn.ReLU(inplace=True), nn.Dropout(dropout),
                                 nn.Linear(inner, width), nn.Dropout(dropout))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.net(x))


class Layer(nn.Module):
    """One decoder layer: relative attention over memory + segment, then the feed-forward."""

    def __init__(self, width: int, heads: int, head_width: int, inner: int, dropout: float, attention_dropout: float):
        super().__init__()
        self.attention = RelativeAttention(width, heads, head_width, dropout, attention_dropout)
        self.feed_forward = FeedForward(width, inner, dropout)

    def forward(self, x, memory, positions, content_bias, position_bias, mask):
        return self.feed_forward(self.attention(x, memory, positions, content_bias, position_bias, mask))


class TransformerXL(nn.Module):
    """Transformer-XL language model with a full, tied softmax: token ids (batch, tokens) in, the mean loss out.

    The targets are the inputs (their shift does not change the cost), the memory zeros of the
    segment's length, as a step's memory is the last step's states with no gradient.
    """

    def __init__(self, layers: int, width: int, heads: int, inner: int, dropout: float, attention_dropout: float,
                 vocab: int = WT103_VOCAB, head_width: int = 64):
        super().__init__()
        self.width, self.head_width, self.heads = width, head_width, heads
        self.embedding = nn.Embedding(vocab, width)
        self.dropout = nn.Dropout(dropout)
        self.content_bias = nn.Parameter(torch.zeros(heads, head_width))
        self.position_bias = nn.Parameter(torch.zeros(heads, head_width))
        self.layers = nn.ModuleList(Layer(width, heads, head_width, inner, dropout, attention_dropout)
                                    for _ in range(layers))
        self.output_bias = nn.Parameter(torch.zeros(vocab))
        inverse = 1 / (10000 ** (torch.arange(0.0, width, 2.0) / width))
        self.register_buffer("inverse_frequency", inverse, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        tokens = ids.t()                                            # (segment, batch), the reference's order
        segment, batch = tokens.shape
        span = 2 * segment
        x = self.dropout(self.embedding(tokens) * math.sqrt(self.width))
        angles = torch.outer(torch.arange(span - 1, -1, -1.0, device=ids.device), self.inverse_frequency)
        positions = self.dropout(torch.cat([angles.sin(), angles.cos()], -1))
        mask = torch.ones(segment, span, dtype=torch.bool, device=ids.device).triu(1 + segment)
        for layer in self.layers:
            memory = x.detach().new_zeros(segment, batch, self.width)
            x = layer(x, memory, positions, self.content_bias, self.position_bias, mask)
        logits = F.linear(x.reshape(-1, self.width), self.embedding.weight, self.output_bias)
        return F.cross_entropy(logits, tokens.reshape(-1))


def transformer_xl_base() -> nn.Module:
    """Transformer-XL base: 16 layers, width 512, 8 heads, inner 2048; 191,948,759 parameters (the logs' count).

    >>> with torch.device("meta"):
    ...     model = transformer_xl_base()
    >>> sum(p.numel() for p in model.parameters()), model(torch.zeros(2, 16, dtype=torch.long, device="meta")).shape
    (191948759, torch.Size([]))
    """
    return TransformerXL(layers=16, width=512, heads=8, inner=2048, dropout=0.1, attention_dropout=0.0)


def transformer_xl_large() -> nn.Module:
    """Transformer-XL large: 18 layers, width 1024, 16 heads, inner 4096; 519,963,095 parameters (the logs' count).

    >>> with torch.device("meta"):
    ...     model = transformer_xl_large()
    >>> sum(p.numel() for p in model.parameters())
    519963095
    """
    return TransformerXL(layers=18, width=1024, heads=16, inner=4096, dropout=0.2, attention_dropout=0.2)
