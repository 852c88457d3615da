"""Sharded optimizer state and gradients: ZeRO stages 1 and 2 for ``DataParallel(shard=...)``.

DeepSpeed's ZeRO (Rajbhandari et al., 2020) without a new engine: every bucket
of :class:`~gpurig.parallel.DataParallel` is cut into ``size`` equal shards, and
rank r owns shard r of every bucket.

- Backward: each bucket's gradients are **reduce-scattered** (averaged), not
  allreduced: rank r receives the average of its shard only.
- ``optimizer.step()``: the optimizer updates rank r's shard of the parameters
  only, so it keeps state (Adam's two moments, SGD's momentum) for 1/N of them
  (:class:`~gpurig.parallel.zero_optimizer.ZeroRedundancyOptimizer`).
- After the step each bucket's parameters are **allgathered**, so every rank
  holds the whole model for the next forward.

A ring reduce-scatter and a ring allgather each put (P−1)/P of the bucket on
the wire: together the 2(P−1)/P of the ring allreduce they replace, so sharding
costs no extra bytes, only a second collective per bucket.

``shard="optimizer"`` (ZeRO stage 1) keeps the whole model's gradient buffers
(as DDP does); ``shard="gradients"`` (stage 2) keeps only this rank's shard of
the averaged gradients: a bucket's full buffer lives from its launch until its
reduce-scatter ends. With ``--accumulate`` the micro-batches' gradients add up
in ``param.grad`` (whole) until the last one.

Compression composes where a reduce-scatter of encoded data is well defined:
the element-wise codecs (:data:`SHARDED_CODECS`) send each rank's chunks
encoded, with error feedback, and the owner decodes and averages them; the
parameters are allgathered exact. PowerSGD averages low-rank factors of whole
matrices, which do not cut into shards; ``auto`` may pick it: both are refused.

>>> comm = gpurig.init()
>>> model = gpurig.DataParallel(torch.nn.Linear(4, 2), shard="optimizer")
>>> optimizer = gpurig.ZeroRedundancyOptimizer(torch.optim.Adam(model.parameters(), lr=0.1), model)
>>> model(torch.ones(8, 4)).sum().backward(); optimizer.step()
>>> sorted(optimizer.state_dict()["state"][0])          # saved whole: resumes on any rank count
['exp_avg', 'exp_avg_sq', 'step']
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

import torch

from gpurig.comm.signature import Signature
from gpurig.parallel import codecs, numerics
from gpurig.parallel.compression import CompressedAverage, collectives, wire_bytes

SHARD_MODES = ("none", "optimizer", "gradients")
SHARDED_CODECS = ("fp16", "bf16", "int8", "int8-dynamic")  # element-wise: a reduce-scatter of encoded chunks


def check_shard(shard: str, compression: str) -> str:
    """``shard`` if DataParallel can shard with ``compression``; ValueError in one line saying why not.

    >>> check_shard("gradients", "int8")
    'gradients'
    >>> check_shard("optimizer", "powersgd")
    Traceback (most recent call last):
    ...
    ValueError: compression 'powersgd' cannot be sharded (its low-rank factors do not cut into shards): use none, fp16, bf16, int8 or int8-dynamic
    """
    if shard not in SHARD_MODES:
        raise ValueError(f"shard must be one of {', '.join(SHARD_MODES)}, got {shard!r}")
    if shard == "none" or compression == "none" or compression in SHARDED_CODECS:
        return shard
    why = "it picks per bucket, PowerSGD too" if compression.startswith("auto") else \
        "its low-rank factors do not cut into shards"
    raise ValueError(f"compression {compression!r} cannot be sharded ({why}): use none, "
                     f"{', '.join(SHARDED_CODECS[:-1])} or {SHARDED_CODECS[-1]}")


def shard_bounds(length: int, ranks: int, rank: int) -> tuple[int, int]:
    """Where rank ``rank``'s shard of a bucket of ``length`` values (a multiple of ``ranks``) starts and ends.

    >>> shard_bounds(12, 3, 1)
    (4, 8)
    """
    per = length // ranks
    return rank * per, (rank + 1) * per


@dataclass
class Segment:
    """A run of this rank's shard holding parameters of one optimizer group, back to back: what the optimizer updates.

    ``tensor`` is a view of the bucket's flat parameters (the module's parameters
    are views of the same buffer), ``grad`` a view of this rank's averaged
    gradient shard; ``pieces`` say which part of which parameter each stretch is:
    (parameter, first element, end element).
    """

    bucket: int
    start: int  # in the bucket's flat buffer
    end: int
    group: int
    tensor: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    pieces: list = field(default_factory=list)


class CompressedReduceScatter(CompressedAverage):
    """The first half of a compressed average: encoded chunks to their owners, decoded, averaged; no allgather.

    After :meth:`finish` rank r's chunk of ``x`` holds the average (what the
    other ranks' encoded chunks and its own exact one give); the rest of ``x`` is
    left as it was.

    >>> pending = CompressedReduceScatter(comm, bucket, codecs.get("int8"), FeedbackState())   # doctest: +SKIP
    >>> sent = pending.finish()                                                                # doctest: +SKIP
    """

    def finish(self) -> int:
        """Wait for the encoded chunks, add them to this rank's own and average; return the bytes this rank sent."""
        ranks, me, work = self.comm.size, self.comm.rank, self.work
        scratch = self.state.buffer("decoded", self.pieces[0][1] - self.pieces[0][0], device=work.device)
        for k in range(len(self.pieces)):
            received = self.scattered[k].wait()
            mine = self._part(work, me, k)
            for r in range(ranks):
                if r != me:
                    codecs.decode_add(self.codec, self._views(k, received[r]), mine, scratch[: mine.numel()])
            mine.div_(ranks)
        if work is not self.x:
            self.x[me * self.chunk: (me + 1) * self.chunk].copy_(work[me * self.chunk: (me + 1) * self.chunk])
        return (ranks - 1) * sum(codecs.payload_bytes(self.codec, end - start) for start, end in self.pieces)


class ShardedBuckets:
    """The sharded side of a DataParallel's buckets: flat parameters, this rank's gradient shards, the collectives.

    DataParallel calls :meth:`launch` for each bucket during backward and
    :meth:`finish` at its end; :class:`ZeroRedundancyOptimizer` calls
    :meth:`gather_parameters` after each step. On wrapping, each bucket's
    parameters move into one flat buffer (the module's parameters become views
    of it, as DDP's gradients are views of their bucket), so the allgather lands
    in them with no copy.

    >>> sharded = ShardedBuckets(model.buckets, comm, "gradients", model.stats)   # doctest: +SKIP
    """

    def __init__(self, buckets: list, comm, stage: str, stats):
        self.buckets, self.comm, self.stage, self.stats = buckets, comm, stage, stats
        self.optimizer = None  # the ZeroRedundancyOptimizer, once wrapped
        # a function giving its DataParallel's timeline now (parallel.timeline.Timeline, or None): the allgather is
        # a wait it records
        self.timeline_of = lambda: None
        self.flat_params: list[torch.Tensor] = []
        self.grad_shards: list[torch.Tensor] = []
        self.bounds: list[tuple[int, int]] = []
        size = comm.size
        with torch.no_grad():
            for bucket in buckets:
                length = -(-len(bucket.flat) // size) * size
                if length != len(bucket.flat):
                    bucket.flat = bucket.flat.new_zeros(length)
                flat = bucket.flat.new_zeros(length)
                for p, offset in zip(bucket.params, bucket.offsets):
                    flat[offset: offset + p.numel()].copy_(p.detach().reshape(-1))
                    p.data = flat[offset: offset + p.numel()].view_as(p)
                lo, hi = shard_bounds(length, size, comm.rank)
                self.flat_params.append(flat)
                self.bounds.append((lo, hi))
                if stage == "gradients":
                    self.grad_shards.append(bucket.flat.new_zeros(hi - lo))
                    bucket.flat = bucket.flat.new_zeros(0)  # the full buffer exists only while a bucket travels
                else:
                    self.grad_shards.append(bucket.flat[lo:hi])
        self.lengths = [len(f) for f in self.flat_params]

    # -- backward: reduce-scatter --------------------------------------------------------------
    def signatures(self, methods: list[str], check_finite: bool) -> list[Signature]:
        """The collectives of a step, in order: backward's reduce-scatters, the agreement on finite gradients
        (``check_finite``), the parameters' allgathers. DataParallel announces them to the guard at once; when
        another collective comes between (fp16's overflow vote), the rest are checked one by one."""
        order = []
        for i, (length, method, bucket) in enumerate(zip(self.lengths, methods, self.buckets)):
            name = f"bucket {i}"
            if method == "none":
                dtype = bucket.params[0].dtype
                order.append(Signature.of("reduce_scatter", torch.empty(length, dtype=dtype, device="meta"), name, "sum"))
            else:
                order += collectives(length, self.comm.size, method, name)[0]
        if check_finite:
            order.append(Signature.of("allreduce", torch.zeros(1), FINITE, "sum"))
        for i, (lo, hi) in enumerate(self.bounds):
            shard = torch.empty(hi - lo, dtype=self.flat_params[i].dtype, device="meta")
            order.append(Signature.of("allgather", shard, _gather_name(i), f"rows {[hi - lo] * self.comm.size}"))
        return order

    def launch(self, bucket, index: int, inline: bool) -> None:
        """Copy the bucket's gradients into its full buffer and start its reduce-scatter; ``param.grad`` is let go.

        ``inline``: reduce-scatter it here, blocking (DataParallel's last bucket over MPI).
        """
        size, name = self.comm.size, f"bucket {index}"
        plain = bucket.method == "none"
        flat = bucket.flat if self.stage == "optimizer" else bucket.flat.new_empty(self.lengths[index])
        if self.stage == "gradients":
            bucket.flat = flat
        scale = 1.0 / size if plain else 1.0
        with torch.no_grad():
            end = 0
            for p, start in zip(bucket.params, bucket.offsets):
                piece = flat[start: start + p.numel()]
                if p.grad is None:
                    piece.zero_()
                else:
                    torch.mul(p.grad.reshape(-1), scale, out=piece)
                end = start + p.numel()
                p.grad = None  # the whole gradient is not kept: this rank's shard of the average is
            flat[end:].zero_()
        out = self.grad_shards[index]
        if plain:
            if inline:
                out.copy_(self.comm.reduce_scatter(flat, op="sum", name=name))
                bucket.handle = None
            else:
                bucket.handle = self.comm.reduce_scatter_async(flat, op="sum", name=name, out=out)
            self.stats.bytes_sent += wire_bytes("none", bucket.shapes, size) // 2
        else:
            codec = codecs.get(bucket.method)
            # begun and finished on the communication thread, so every rank submits its pieces in the same order
            bucket.handle = self.comm.run_async(
                lambda: CompressedReduceScatter(self.comm, flat, codec, bucket.state, name).finish())

    def finish(self) -> None:
        """After backward's waits: this rank's averaged gradient shards reach the optimizer's segments."""
        if self.optimizer is None:
            raise RuntimeError("DataParallel(shard=...) leaves each rank only its shard of the gradients: wrap the "
                               "optimizer first, optimizer = gpurig.ZeroRedundancyOptimizer(optimizer, model)")
        for index, bucket in enumerate(self.buckets):
            if bucket.method != "none" and bucket.handle is not None:  # compressed: the average is in our chunk
                self.stats.bytes_sent += bucket.handle.wait()
                if self.stage == "gradients":
                    lo, hi = self.bounds[index]
                    self.grad_shards[index].copy_(bucket.flat[lo:hi])
            if self.stage == "gradients":
                bucket.flat = bucket.flat.new_zeros(0)
        for segment in self.optimizer.segments:
            segment.tensor.grad = segment.grad

    def all_finite(self, names: dict) -> tuple[bool, tuple[str, str] | None]:
        """Whether every rank's gradient shards are finite (one tiny allreduce); if not, the first bad parameter
        (name, "NaN" or "Inf") found on the lowest rank that has one."""
        bad = None
        if not numerics.all_finite(self.grad_shards):  # None after all: the sums overflowed, the values are finite
            bad = numerics.first_nonfinite([(names.get(id(p), "?"), s.grad[a - s.start: b - s.start]) for s in
                                            self.optimizer.segments for p, a, b, in _in_buffer(s)])
        flag = torch.tensor([0.0 if bad is None else 1.0])
        if self.comm.size > 1:
            self.comm.allreduce(flag, op="sum", name=FINITE)
        if flag.item() == 0.0:
            return True, None
        found = [json.loads(raw) for raw in self.comm.allgather_bytes(json.dumps(bad).encode())] \
            if self.comm.size > 1 else [bad]
        found = [f for f in found if f]
        return False, (tuple(found[0]) if found else None)

    def clip_grad_norm_(self, max_norm: float, norm_type: float) -> torch.Tensor:
        """The whole model's gradient norm from every rank's shards (:meth:`DataParallel.clip_grad_norm_`); each
        shard scaled by ``max_norm / norm`` where that is below 1."""
        shards = [g for g in self.grad_shards if g.numel()]
        if math.isinf(norm_type):
            local = torch.stack([g.detach().abs().max().float() for g in shards]).max() if shards else torch.zeros(())
            total = self.comm.allgather(local.reshape(1).cpu(), name=CLIP).max() if self.comm.size > 1 else local
        else:
            local = sum((g.detach().float().norm(norm_type) ** norm_type for g in shards), torch.zeros(()))
            summed = local.reshape(1).cpu()
            if self.comm.size > 1:
                self.comm.allreduce(summed, op="sum", name=CLIP)
            total = summed[0] ** (1.0 / norm_type)
        coefficient = max_norm / (float(total) + 1e-6)
        if coefficient < 1.0:
            with torch.no_grad():
                for g in shards:
                    g.mul_(coefficient)
        return total.reshape(())

    def drop_gradients(self) -> None:
        """A skipped step: the optimizer sees no gradient, so it leaves the weights and its state alone."""
        if self.optimizer is not None:
            for segment in self.optimizer.segments:
                segment.tensor.grad = None

    # -- after the step: allgather ----------------------------------------------------------------
    def gather_parameters(self) -> None:
        """Every rank's updated shard of every bucket to every rank: afterwards all hold the same whole model."""
        size = self.comm.size
        if size == 1:
            return
        began = time.perf_counter()
        sends = [flat[lo:hi].clone() for flat, (lo, hi) in zip(self.flat_params, self.bounds)]
        rows = [[len(s)] * size for s in sends]
        names = [_gather_name(i) for i in range(len(sends))]
        # every bucket on the wire at once, straight into the flat parameters (MPI_Iallgather, Gloo's async_op)
        handles = [self.comm.allgather_async(s, sizes=r, name=n, out=flat)
                   for s, r, n, flat in zip(sends, rows, names, self.flat_params)]
        for handle in handles:
            handle.wait()
        self.stats.bytes_sent += sum(wire_bytes("none", bucket.shapes, size) // 2 for bucket in self.buckets)
        ended = time.perf_counter()
        waited = ended - began  # nothing hides it (yet): the step's exposed communication
        self.stats.exposed_s += waited
        self.stats.last_exposed_s += waited
        timeline = self.timeline_of()
        if timeline is not None:   # inside the optimizer's span: cut out of it, as printed
            timeline.exposed(began, ended)

    def segments(self, group_of: dict) -> list[Segment]:
        """This rank's shard of every bucket cut into :class:`Segment` s: runs of parameters of one group
        (``group_of``: id(parameter) -> group index; parameters in no group are not updated here)."""
        out: list[Segment] = []
        for b, bucket in enumerate(self.buckets):
            lo, hi = self.bounds[b]
            last_group = None
            for p, offset in zip(bucket.params, bucket.offsets):
                start, end = max(offset, lo), min(offset + p.numel(), hi)
                group = group_of.get(id(p))
                if start >= end or group is None:
                    last_group = None
                    continue
                if last_group == group and out[-1].end == start:
                    seg = out[-1]
                    seg.end = end
                else:
                    seg = Segment(b, start, end, group)
                    out.append(seg)
                seg.pieces.append((p, start - offset, end - offset))
                last_group = group
        for seg in out:
            lo, _ = self.bounds[seg.bucket]
            seg.tensor = self.flat_params[seg.bucket][seg.start: seg.end]
            seg.grad = self.grad_shards[seg.bucket][seg.start - lo: seg.end - lo]
        return out

    def where(self, param: torch.Tensor) -> tuple[int, int]:
        """(bucket, offset) of a parameter in the flat buffers."""
        for b, bucket in enumerate(self.buckets):
            for p, offset in zip(bucket.params, bucket.offsets):
                if p is param:
                    return b, offset
        raise KeyError("parameter not in any bucket")


FINITE = "sharded gradients finite"
CLIP = "sharded gradient norm"


def _gather_name(index: int) -> str:
    return f"bucket {index} parameters"


def _in_buffer(segment: Segment):
    """Each piece of a segment as (parameter, start, end) in the bucket's flat buffer."""
    offset = segment.start
    for p, a, b in segment.pieces:
        yield p, offset, offset + (b - a)
        offset += b - a
