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
per rank, in a :class:`~gpurig.parallel.feedback.FeedbackState`, and is saved with checkpoints.
"""

from __future__ import annotations

import math
import time

import torch

from gpurig.comm.signature import Signature
from gpurig.parallel import codecs, powersgd
from gpurig.parallel.feedback import FeedbackState

POWERSGD = "powersgd"


def parse_method(name: str) -> tuple[str, int | None]:
    """Split a method name into (kind, PowerSGD rank); raise ValueError, naming the choices, if unknown.

    >>> parse_method("int8"), parse_method("powersgd"), parse_method("powersgd:2")
    (('int8', None), ('powersgd', 4), ('powersgd', 2))
    """
    if name == POWERSGD or name.startswith(POWERSGD + ":"):
        rank_text = name.partition(":")[2] if ":" in name else str(powersgd.DEFAULT_RANK)
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


PIECE_BYTES = 256 * 1024  # compressed bytes per message: encoding the next piece overlaps sending this one
MAX_PIECES = 8


def piece_bounds(chunk: int, codec: codecs.Codec) -> list[tuple[int, int]]:
    """Where a rank's chunk is cut for the pipeline: about :data:`PIECE_BYTES` compressed each, whole blocks.

    >>> piece_bounds(3 * 2**20, codecs.get("int8"))[:2], len(piece_bounds(3 * 2**20, codecs.get("int8")))
    ([(0, 393216), (393216, 786432)], 8)
    >>> piece_bounds(4096, codecs.get("int8"))
    [(0, 4096)]
    """
    count = max(1, min(MAX_PIECES, round(codecs.payload_bytes(codec, chunk) / PIECE_BYTES)))
    unit = codecs.BLOCK if codec.blockwise else 1
    per = -(-chunk // (unit * count)) * unit
    return [(start, min(start + per, chunk)) for start in range(0, chunk, per)]


def piece_label(name: str | None, k: int) -> str:
    """The name piece ``k``'s collectives carry (what :func:`collectives` announces and the averaging submits).

    >>> piece_label("bucket 0", 2), piece_label(None, 0)
    ('bucket 0 piece 2', 'piece 0')
    """
    return f"{name} piece {k}" if name else f"piece {k}"


def collectives(n: int, ranks: int, method: str, name: str | None = None,
                shapes: list[torch.Size] | None = None, dtype: torch.dtype = torch.float32) -> tuple[list, list]:
    """The collectives averaging a bucket of ``n`` values with ``method`` submits: (when it begins, when it
    finishes), each in order. PowerSGD's depend on the tensors' ``shapes``, not only on ``n``; an uncompressed
    bucket's on its ``dtype`` (a float64 or bfloat16 model's gradients travel as they are).

    DataParallel announces them, so the guard checks a whole step with one exchange.

    >>> begun, finished = collectives(4096, 2, "int8", "bucket 0")
    >>> [s.describe() for s in begun + finished]
    ["alltoall 'bucket 0 piece 0' uint8[2,2056]", "allgather 'bucket 0 piece 0' uint8[1,2056] rows [1, 1]"]
    """
    kind, rank = parse_method(method)
    if kind == POWERSGD:
        return powersgd.collectives(shapes, rank, name)
    if kind == "none":
        return [Signature.of("allreduce", torch.empty(n, dtype=dtype, device="meta"), name, "sum")], []
    codec = codecs.get(kind)
    pieces = piece_bounds(chunk_length(n, ranks, codec), codec)
    rows = [codecs.payload_bytes(codec, b - a) for a, b in pieces]
    label = [piece_label(name, k) for k in range(len(pieces))]
    return ([Signature("alltoall", label[k], "uint8", (ranks, row)) for k, row in enumerate(rows)],
            [Signature("allgather", label[k], "uint8", (1, row), f"rows {[1] * ranks}") for k, row in enumerate(rows)])


def compressed_average(comm, x: torch.Tensor, codec: codecs.Codec, state: FeedbackState,
                       name: str | None = None) -> int:
    """Average the flat float32 ``x`` over all ranks through ``codec``, in place; return the bytes this rank sent.

    Must be called by every rank with the same ``x.numel()`` and codec. The
    same as beginning a :class:`CompressedAverage` and finishing it at once.

    >>> sent = compressed_average(comm, grad, codecs.get("int8"), FeedbackState())   # doctest: +SKIP
    """
    return CompressedAverage(comm, x, codec, state, name).finish()


class CompressedAverage:
    """One bucket's compressed average in flight: begun, then finished, possibly with other work between.

    Beginning it compresses this rank's pieces of every other rank's chunk and
    starts sending them (the reduce-scatter); :meth:`finish` adds what arrives
    to this rank's own chunk, compresses the average and allgathers it. Each
    chunk is cut into pieces (:func:`piece_bounds`) that travel as separate
    non-blocking collectives, so one piece is encoded or decoded while another
    is on the wire. DataParallel begins the next bucket before finishing this
    one, keeping the link busy across buckets. When ``x`` is a whole number of
    chunks (:func:`padded_bucket_length`) it is the working buffer; otherwise
    it is copied once.

    >>> average = CompressedAverage(comm, grad, codecs.get("int8"), FeedbackState())   # doctest: +SKIP
    >>> sent = average.finish()                                                        # doctest: +SKIP
    """

    def __init__(self, comm, x: torch.Tensor, codec: codecs.Codec, state: FeedbackState, name: str | None = None):
        n, ranks, me = x.numel(), comm.size, comm.rank
        self.comm, self.x, self.codec, self.state = comm, x, codec, state
        self.chunk = chunk = chunk_length(n, ranks, codec)
        self.work = x if n == chunk * ranks else state.buffer("padded", chunk * ranks, device=x.device)
        if self.work is not x:
            self.work[:n].copy_(x)
            self.work[n:].zero_()
        if codec.lossy and state.sent is None:
            state.sent = torch.zeros_like(self.work)
        if codec.lossy and state.owned is None:
            state.owned = torch.zeros(chunk, device=x.device)
        self.pieces = piece_bounds(chunk, codec)
        self.labels = [piece_label(name, k) for k in range(len(self.pieces))]
        # 1. Reduce-scatter: piece k of chunk r, compressed, to rank r. This rank's own chunk never travels, so it
        #    stays exact.
        self.scattered = []
        for k in range(len(self.pieces)):
            send = self._buffer("send", k, ranks)
            for r in range(ranks):
                if r != me:
                    codecs.encode_with_feedback(codec, self._part(self.work, r, k), self._part(state.sent, r, k),
                                                self._views(k, send[r]))
            self.scattered.append(comm.alltoall_async(send, out=self._buffer("received", k, ranks),
                                                      name=self.labels[k]))
            _keep_moving(self.scattered)

    def finish(self) -> int:
        """Wait for the pieces, average, allgather and decode into ``x``; return the bytes this rank sent."""
        comm, codec, state, work = self.comm, self.codec, self.state, self.work
        ranks, me = comm.size, comm.rank
        # 2. Allgather of every piece's compressed average; each rank decodes all of them, its own too, so the
        #    result is bit-identical everywhere.
        gathered = []
        scratch = state.buffer("decoded", self.pieces[0][1] - self.pieces[0][0], device=work.device)
        for k in range(len(self.pieces)):
            received = self.scattered[k].wait()
            mine = self._part(work, me, k)
            for r in range(ranks):
                if r != me:
                    codecs.decode_add(codec, self._views(k, received[r]), mine, scratch[: mine.numel()])
            mine.div_(ranks)
            owned = self._buffer("owned", k, 1)
            codecs.encode_with_feedback(codec, mine, self._part(state.owned, 0, k), self._views(k, owned[0]))
            gathered.append(comm.allgather_async(owned, sizes=[1] * ranks, name=self.labels[k],
                                                 out=self._buffer("gathered", k, ranks)))
            _keep_moving(gathered)
        for k in range(len(self.pieces)):
            everyone = gathered[k].wait()
            for r in range(ranks):
                codecs.decode_into(codec, self._views(k, everyone[r]), self._part(work, r, k))
        if work is not self.x:
            self.x.copy_(work[: self.x.numel()])
        return 2 * (ranks - 1) * sum(codecs.payload_bytes(codec, end - start) for start, end in self.pieces)

    def _part(self, tensor: torch.Tensor | None, r: int, k: int) -> torch.Tensor | None:
        """Piece ``k`` of rank ``r``'s chunk of ``tensor``."""
        start, end = self.pieces[k]
        return None if tensor is None else tensor[r * self.chunk + start: r * self.chunk + end]

    def _buffer(self, what: str, k: int, rows: int) -> torch.Tensor:
        """A payload buffer of ``rows`` rows for piece ``k``, kept in the state between steps."""
        length = self.pieces[k][1] - self.pieces[k][0]
        return self.state.buffer(f"{what} {k}", rows * codecs.payload_bytes(self.codec, length), torch.uint8,
                                 self.work.device).view(rows, -1)

    def _views(self, k: int, row: torch.Tensor):
        return codecs.payload_views(self.codec, self.pieces[k][1] - self.pieces[k][0], row)


def _keep_moving(handles) -> None:
    """Ask about every transfer in flight: MPI moves bytes only inside its calls (Gloo and NCCL need not)."""
    for handle in handles:
        handle.is_completed()


def begin_average(comm, flat: torch.Tensor, method: str, state: FeedbackState, shapes: list[torch.Size],
                  name: str | None = None) -> "CompressedAverage | powersgd.LowRankAverage":
    """Begin averaging ``flat`` (the gradients of tensors of ``shapes``, back to back) with a compressing
    ``method``; the returned average's ``finish()`` completes it in place and returns the bytes this rank sent.

    >>> pending = begin_average(comm, bucket, "powersgd", FeedbackState(), [p.shape for p in params])  # doctest: +SKIP
    >>> sent = pending.finish()                                                                        # doctest: +SKIP
    """
    kind, rank = parse_method(method)
    if kind == POWERSGD:
        return powersgd.LowRankAverage(comm, flat, shapes, rank, state, name)
    return CompressedAverage(comm, flat, codecs.get(kind), state, name)


def average(comm, flat: torch.Tensor, method: str, state: FeedbackState, shapes: list[torch.Size],
            name: str | None = None) -> int:
    """Average ``flat`` (the gradients of tensors of ``shapes``, back to back) in place with ``method``.

    Returns the bytes this rank sent. For ``none`` any residual left by an
    earlier lossy method is added once, so nothing it owed is lost.

    >>> sent = average(comm, bucket, "int8", FeedbackState(), [p.shape for p in params])   # doctest: +SKIP
    """
    if method == "none":
        if state.sent is not None:
            flat.add_(state.sent[: flat.numel()])
            state.sent = state.owned = None
        comm.allreduce(flat, op="average", name=name)
        return wire_bytes("none", shapes, comm.size)
    return begin_average(comm, flat, method, state, shapes, name).finish()


def timed_average(comm, flat: torch.Tensor, method: str, state: FeedbackState, shapes: list[torch.Size]) -> float:
    """Seconds one compressed :func:`average` of ``flat`` takes on this rank, as a step's bucket takes it.

    Its collectives are announced first (DataParallel checks a whole step with
    one exchange), then all ranks start together (a barrier) and it runs on the
    communication thread.

    >>> seconds = timed_average(comm, bucket.clone(), "int8", FeedbackState(), [p.shape for p in params])  # doctest: +SKIP
    """
    begun, finished = collectives(flat.numel(), comm.size, method, shapes=shapes)
    comm.expect(begun + finished)
    comm.barrier()
    start = time.perf_counter()
    comm.run_async(lambda: average(comm, flat, method, state, shapes)).wait()
    return time.perf_counter() - start


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
