"""Averaging one bucket of gradients over all ranks, compressed or not.

A *method* says how a bucket travels; it is chosen per bucket:

- ``none``: a plain ring allreduce of float32.
- an element-wise codec (``fp16``, ``bf16``, ``int8``, ``int8-dynamic``):
  :func:`compressed_average`, a reduce-scatter then an allgather of compressed
  chunks. Each rank cuts the bucket into ``size`` chunks, compresses every
  chunk but its own and sends chunk r to rank r (one all-to-all); rank r adds
  the decoded chunks to its own exact one, averages, compresses the average and
  sends it to everybody (one allgather). So every rank sends 2(P−1)/P of the
  compressed size — unlike sending the whole compressed gradient to every peer,
  the 2015 pattern, whose traffic grows with P and which loses to a plain fp32
  ring past 8 ranks. Both compressions keep error feedback: the sender's
  residual (what its chunks lost) and the chunk owner's residual (what the
  average lost) are added back at the next step.
- ``powersgd`` / ``powersgd:R``: low-rank, :mod:`gpurig.parallel.powersgd`.

All state a bucket keeps between steps (residuals, PowerSGD's warm start) is
per rank, in a :class:`FeedbackState`, and is saved with checkpoints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from gpurig.parallel import codecs, powersgd

POWERSGD = "powersgd"


def parse_method(name: str) -> tuple[str, int | None]:
    """Split a method name into (kind, PowerSGD rank); raise ValueError, naming the choices, if unknown.

    >>> parse_method("int8"), parse_method("powersgd"), parse_method("powersgd:2")
    (('int8', None), ('powersgd', 4), ('powersgd', 2))
    """
    if name == POWERSGD or name.startswith(POWERSGD + ":"):
        rank_text = name.partition(":")[2] or str(powersgd.DEFAULT_RANK)
        if not rank_text.isdigit() or int(rank_text) < 1:
            raise ValueError(f"compression {name!r}: the PowerSGD rank after ':' must be a positive integer")
        return POWERSGD, int(rank_text)
    if name not in codecs.CODECS:
        raise ValueError(f"unknown compression {name!r}; choose one of: {', '.join(method_names())}")
    return name, None


def method_names() -> list[str]:
    """Every method name a user can ask for (PowerSGD also as ``powersgd:R`` for rank R).

    >>> method_names()
    ['none', 'fp16', 'bf16', 'int8', 'int8-dynamic', 'powersgd']
    """
    return [*codecs.CODECS, POWERSGD]


@dataclass
class FeedbackState:
    """What one bucket keeps between steps on one rank: error-feedback residuals and scratch buffers.

    ``sent``: what this rank's compressed chunks lost (bucket length; PowerSGD's
    residual too). ``owned``: what the compressed average of the chunk this rank
    owns lost. ``lowrank``: PowerSGD's warm-start factors. Scratch buffers are
    not saved.
    """

    sent: torch.Tensor | None = None
    owned: torch.Tensor | None = None
    lowrank: list[torch.Tensor] | None = None
    scratch: dict = field(default_factory=dict, repr=False)

    def buffer(self, name: str, numel: int, dtype=torch.float32, device=None) -> torch.Tensor:
        """A scratch tensor kept between steps (allocated once per size)."""
        held = self.scratch.get(name)
        if held is None or held.numel() != numel or held.dtype != dtype or held.device != torch.device(device or "cpu"):
            held = self.scratch[name] = torch.empty(numel, dtype=dtype, device=device)
        return held

    def saved(self) -> dict:
        """The tensors a checkpoint keeps (residuals, warm start)."""
        return {"sent": self.sent, "owned": self.owned, "lowrank": self.lowrank}

    def restore(self, saved: dict) -> None:
        self.sent, self.owned, self.lowrank = saved.get("sent"), saved.get("owned"), saved.get("lowrank")


def chunk_length(n: int, ranks: int, codec: codecs.Codec) -> int:
    """Elements per rank's chunk: n split over ranks, rounded up to what the codec encodes.

    >>> chunk_length(10_000, 4, codecs.get("int8")), chunk_length(10_000, 4, codecs.get("fp16"))
    (3072, 2500)
    """
    return codecs.padded_length(-(-n // ranks), codec)


def padded_bucket_length(n: int, ranks: int, method: str) -> int:
    """How long a bucket buffer of ``n`` gradients should be so ``method`` needs no copy (chunks × ranks).

    >>> padded_bucket_length(10_000, 4, "int8"), padded_bucket_length(10_000, 4, "none")
    (12288, 10000)
    """
    kind, _ = parse_method(method)
    if kind in ("none", POWERSGD):
        return n
    return chunk_length(n, ranks, codecs.get(kind)) * ranks


def wire_bytes(method: str, shapes: list[torch.Size], ranks: int) -> int:
    """Bytes one rank sends to average a bucket holding tensors of ``shapes`` with ``method``.

    A ring allreduce and the compressed reduce-scatter + allgather both send
    2(P−1)/P of what they average.

    >>> wire_bytes("none", [torch.Size([1000, 1000])], 2), wire_bytes("int8", [torch.Size([1000, 1000])], 2)
    (4000000, 1005384)
    """
    n = sum(math.prod(s) for s in shapes)
    kind, rank = parse_method(method)
    if kind == POWERSGD:
        return 2 * (ranks - 1) * 4 * powersgd.factor_values(shapes, rank) // ranks
    codec = codecs.get(kind)
    if kind == "none":
        return 2 * (ranks - 1) * 4 * n // ranks
    return 2 * (ranks - 1) * codecs.payload_bytes(codec, chunk_length(n, ranks, codec))


def compressed_average(comm, x: torch.Tensor, codec: codecs.Codec, state: FeedbackState) -> int:
    """Average the flat float32 ``x`` over all ranks through ``codec``, in place; return the bytes this rank sent.

    Must be called by every rank with the same ``x.numel()`` and codec. When
    ``x`` is already a whole number of chunks (:func:`padded_bucket_length`) it
    is used as the working buffer; otherwise it is copied once.

    >>> sent = compressed_average(comm, grad, codecs.get("int8"), FeedbackState())   # doctest: +SKIP
    """
    n, ranks, me = x.numel(), comm.size, comm.rank
    chunk = chunk_length(n, ranks, codec)
    work = x if n == chunk * ranks else state.buffer("padded", chunk * ranks, device=x.device)
    if work is not x:
        work[:n].copy_(x)
        work[n:].zero_()
    if codec.lossy and state.sent is None:
        state.sent = torch.zeros_like(work)
    row = codecs.payload_bytes(codec, chunk)

    def piece(tensor, r):
        return None if tensor is None else tensor[r * chunk: (r + 1) * chunk]

    # 1. Reduce-scatter: chunk r, compressed, to rank r. This rank's own chunk never travels, so it stays exact.
    send = state.buffer("send", ranks * row, torch.uint8, x.device).view(ranks, row)
    for r in range(ranks):
        if r != me:
            codecs.encode_with_feedback(codec, piece(work, r), piece(state.sent, r),
                                        codecs.payload_views(codec, chunk, send[r]))
    received = comm.alltoall(send)
    mine, decoded = piece(work, me), state.buffer("decoded", chunk, device=x.device)
    for r in range(ranks):
        if r != me:
            codec.decode(codecs.payload_views(codec, chunk, received[r]), decoded)
            mine.add_(decoded)
    mine.div_(ranks)

    # 2. Allgather of every chunk's compressed average; each rank decodes all of them, its own too, so the
    #    result is bit-identical everywhere.
    if codec.lossy and state.owned is None:
        state.owned = torch.zeros_like(mine)
    owned = state.buffer("owned_payload", row, torch.uint8, x.device)
    state.owned = codecs.encode_with_feedback(codec, mine, state.owned, codecs.payload_views(codec, chunk, owned))
    gathered = comm.allgather(owned.view(1, row), sizes=[1] * ranks)
    for r in range(ranks):
        codec.decode(codecs.payload_views(codec, chunk, gathered[r]), piece(work, r))
    if work is not x:
        x.copy_(work[:n])
    return 2 * (ranks - 1) * row


def average(comm, flat: torch.Tensor, method: str, state: FeedbackState, shapes: list[torch.Size]) -> int:
    """Average ``flat`` (the gradients of tensors of ``shapes``, back to back) in place with ``method``.

    Returns the bytes this rank sent. For ``none`` any residual left by an
    earlier lossy method is added once, so nothing it owed is lost.

    >>> sent = average(comm, bucket, "int8", FeedbackState(), [p.shape for p in params])   # doctest: +SKIP
    """
    kind, rank = parse_method(method)
    if kind == POWERSGD:
        return powersgd.lowrank_average(comm, flat, shapes, rank, state)
    if kind == "none":
        if state.sent is not None:
            flat.add_(state.sent[: flat.numel()])
            state.sent = state.owned = None
        comm.allreduce(flat, op="average")
        return wire_bytes("none", shapes, comm.size)
    return compressed_average(comm, flat, codecs.get(kind), state)


def switch_method(state: FeedbackState, old: str, new: str, rank: int, ranks: int) -> None:
    """Carry a bucket's residuals over when its method changes, so what the old method owed is still paid.

    The owner's residual of chunk r is debt of the *average*: rank r folds it,
    times the rank count, into its own residual for that chunk. PowerSGD's
    factors do not carry over.

    >>> s = FeedbackState(sent=torch.zeros(4), owned=torch.ones(2)); switch_method(s, "int8", "fp16", 1, 2)
    >>> s.sent, s.owned
    (tensor([0., 0., 2., 2.]), None)
    """
    if old == new:
        return
    if state.owned is not None and state.sent is not None:
        chunk = state.owned.numel()
        state.sent[rank * chunk: (rank + 1) * chunk].add_(state.owned, alpha=ranks)
    state.owned, state.lowrank = None, None
    state.scratch.clear()
