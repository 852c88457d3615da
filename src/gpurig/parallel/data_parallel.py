"""Data parallelism: the same weights on every rank, gradients averaged during backward.

One training step, as the source describes it: each rank runs forward and
backward on its part of the global batch; as soon as the gradients of a bucket
of parameters are ready, that bucket's allreduce starts (the engine's own
nonblocking collective, begun on autograd's thread and nudged forward at each
later gradient), while autograd goes on computing earlier layers. At the end
of backward every rank waits for its buckets and finds the averaged gradient in
``param.grad``, so any torch optimizer then applies the same update everywhere.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from gpurig import comm as comm_mod
from gpurig.comm.signature import Signature
from gpurig.parallel import auto, codecs, numerics, powersgd, zero
from gpurig.parallel import timeline as timeline_mod
from gpurig.parallel.compression import (POWERSGD, CompressedAverage, FeedbackState, begin_average, collectives,
                                         padded_bucket_length, parse_method, switch_method, timed_average,
                                         wire_bytes)
from gpurig.perf.timeline import bucket_thread

DEFAULT_BUCKET_MB = 25.0
COMPRESSED_BUCKET_MB = 4.0  # compressed buckets are cheap to send: smaller ones start travelling during backward
FIRST_BUCKET_MB = 1.0  # the last layers' gradients leave early (DDP's first bucket)
AUTO_CALIBRATION_STEPS = 6  # uncompressed steps measured before the first choice (the first is warm-up)
AUTO_REVIEW_STEPS = 20      # compression="auto" compares the last steps' wait with the settled one this often ...
AUTO_REVIEW_MAX_STEPS = 640  # ... twice as seldom after each new decision that changed nothing
AUTO_TRIAL_STEPS = 4        # steps per shortlisted assignment (the first after a switch is not timed)
AUTO_TRIAL_MARGIN = 0.03    # the model's choice stays unless another measured this much faster


class ModelMismatchError(ValueError):
    """Ranks wrapped models whose parameters differ in name, shape or dtype."""


class PlainLaunch(NamedTuple):
    """What a bucket's uncompressed allreduce needs at every step, worked out once for its layout.

    ``prepared`` is the collective made ready (:meth:`Communicator.prepare_allreduce`), or None where it goes
    through ``allreduce_async``; ``sent`` the bytes this rank sends for it.
    """

    tensor: torch.Tensor
    prepared: comm_mod.Prepared | None
    sent: int


@dataclass(eq=False)  # a bucket is itself, not its fields: buckets.index(b) must not compare tensors
class Bucket:
    """Parameters whose gradients travel together, and how they travel (``method``, per bucket).

    ``flat`` holds the gradients back to back, padded so that compressed
    chunks need no copy; ``state`` keeps the method's residuals between steps.
    With ``flagged``, one more element after the gradients travels with them:
    how many ranks flagged their gradients for the numerical guard
    (:func:`gpurig.parallel.numerics.copy_flagged`).
    """

    params: list[torch.nn.Parameter]
    flat: torch.Tensor
    offsets: list[int]
    method: str = "none"
    state: FeedbackState = field(default_factory=FeedbackState)
    ready: int = 0
    handle: comm_mod.Handle | None = None
    launched_at: float = 0.0
    flagged: bool = False
    plain_launch: PlainLaunch | None = field(default=None, repr=False)  # DataParallel's, for ``travelling``
    _cut_from: torch.Tensor | None = field(default=None, repr=False)  # the flat the views below were cut from
    _pieces: list = field(default_factory=list, repr=False)
    _grads: list = field(default_factory=list, repr=False)
    _ends: tuple = field(default=(None, None, None, None), repr=False)  # (flat, flagged, travelling, flag)

    @functools.cached_property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def views(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each parameter's stretch of ``flat``, flat and in the parameter's shape: cut once (again only when
        ``flat`` is replaced), where cutting them at every step made 2 tensors per parameter (~7 µs each).

        >>> b = Bucket([torch.nn.Parameter(torch.zeros(2, 3))], torch.arange(6.0), [0])
        >>> pieces, grads = b.views(); pieces[0].shape, grads[0].shape, grads[0].data_ptr() == b.flat.data_ptr()
        (torch.Size([6]), torch.Size([2, 3]), True)
        """
        if self._cut_from is not self.flat:
            self._pieces = [self.flat[o: o + p.numel()] for p, o in zip(self.params, self.offsets)]
            self._grads = [piece.view_as(p) for piece, p in zip(self._pieces, self.params)]
            self._cut_from = self.flat
        return self._pieces, self._grads

    @property
    def travelling(self) -> torch.Tensor:
        """What an uncompressed allreduce of this bucket carries: the gradients, and the guard's flag if any (the
        same view at every step until ``flat`` is replaced).

        >>> b = Bucket([torch.nn.Parameter(torch.zeros(3))], torch.zeros(4), [0], flagged=True)
        >>> b.travelling.shape, b.travelling is b.travelling
        (torch.Size([4]), True)
        """
        return self._cut_ends()[2]

    @property
    def flag(self) -> torch.Tensor | None:
        """The numerical guard's flag, the element after the gradients (None when the bucket has none)."""
        return self._cut_ends()[3]

    def _cut_ends(self) -> tuple:
        if self._ends[0] is not self.flat or self._ends[1] != self.flagged:
            flag = self.flat[self.numel: self.numel + 1] if self.flagged else None
            self._ends = (self.flat, self.flagged, self.flat[: self.numel + self.flagged], flag)
        return self._ends

    @property
    def shapes(self) -> list[torch.Size]:
        return [p.shape for p in self.params]


@dataclass
class CommStats:
    """What the last backward passes spent on communication, in the predictor's terms.

    ``exposed_s`` is the time backward's end waited for allreduces, i.e.
    communication (and waiting for slower ranks) not hidden under computation.
    ``bytes_sent`` is what this rank put on the wire: 2(P−1)/P of each bucket for
    a ring allreduce, of its compressed size with compression.
    """

    steps: int = 0
    bytes_sent: int = 0
    exposed_s: float = 0.0
    launched_in_backward: int = 0
    launched_at_end: int = 0
    last_exposed_s: float = 0.0
    skipped_steps: int = 0


def assign_buckets(params: list[torch.Tensor], cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """Group parameter indices into buckets of about ``cap_bytes``, in reverse order.

    Backward produces the last layer's gradients first, so buckets start from the
    end of the parameter list. As in PyTorch DDP, a parameter joins the open
    bucket and the bucket closes once it holds ``cap_bytes`` or more (the first
    one at ``first_cap_bytes``), so small biases ride along with their weights
    instead of costing a collective of their own. A bucket never mixes dtypes or
    devices.

    >>> ps = [torch.zeros(10), torch.zeros(10), torch.zeros(1000)]
    >>> assign_buckets(ps, cap_bytes=100)
    [[2], [1, 0]]
    >>> assign_buckets([torch.zeros(10)] * 4, cap_bytes=1000, first_cap_bytes=40)
    [[3], [2, 1, 0]]
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in reversed(range(len(params))):
        p = params[index]
        if current and (params[current[0]].dtype, params[current[0]].device) != (p.dtype, p.device):
            buckets.append(current)
            current, size = [], 0
        current.append(index)
        size += p.numel() * p.element_size()
        cap = cap_bytes if buckets or first_cap_bytes is None else min(cap_bytes, first_cap_bytes)
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def model_signature(module: torch.nn.Module) -> list[list]:
    """Name, shape, dtype and whether it trains (``requires_grad``) of every parameter and buffer, in registration
    order: which parameters train decides what the buckets hold.

    >>> model_signature(torch.nn.Linear(2, 3))
    [['param', 'weight', [3, 2], 'torch.float32', True], ['param', 'bias', [3], 'torch.float32', True]]
    """
    rows = [["param", n, list(p.shape), str(p.dtype), p.requires_grad] for n, p in module.named_parameters()]
    rows += [["buffer", n, list(b.shape), str(b.dtype), False] for n, b in module.named_buffers()]
    return rows


def first_difference(signatures: list[list[list]]) -> str | None:
    """Describe the first way any rank's signature differs from rank 0's, or None.

    >>> a = [["param", "w", [3, 2], "torch.float32"]]
    >>> b = [["param", "w", [3, 4], "torch.float32"]]
    >>> first_difference([a, b])
    "param 'w': rank 0 has shape [3, 2] torch.float32, rank 1 has shape [3, 4] torch.float32"
    """
    reference = signatures[0]
    for rank, sig in enumerate(signatures[1:], start=1):
        for mine, theirs in zip(reference, sig):
            if mine != theirs:
                if mine[:2] != theirs[:2]:
                    return f"rank 0 has {mine[0]} '{mine[1]}' where rank {rank} has {theirs[0]} '{theirs[1]}'"
                if mine[:4] == theirs[:4]:
                    return (f"{mine[0]} '{mine[1]}': requires_grad is {mine[4]} on rank 0, {theirs[4]} on rank "
                            f"{rank} (freeze the same parameters on every rank)")
                return (f"{mine[0]} '{mine[1]}': rank 0 has shape {mine[2]} {mine[3]}, "
                        f"rank {rank} has shape {theirs[2]} {theirs[3]}")
        if len(sig) != len(reference):
            longer, who = (reference, 0) if len(reference) > len(sig) else (sig, rank)
            extra = longer[min(len(reference), len(sig))]
            return f"only rank {who} has {extra[0]} '{extra[1]}' ({len(reference)} tensors on rank 0, {len(sig)} on rank {rank})"
    return None


def check_same_model(comm: comm_mod.Communicator, module: torch.nn.Module) -> None:
    """Raise :class:`ModelMismatchError` on every rank unless all ranks hold the same model layout.

    >>> check_same_model(gpurig.init(), torch.nn.Linear(2, 3))   # doctest: +SKIP
    """
    mine = json.dumps(model_signature(module)).encode()
    everyone = [json.loads(raw) for raw in comm.allgather_bytes(mine)]
    difference = first_difference(everyone)
    if difference:
        raise ModelMismatchError(f"the model differs across ranks: {difference}")


def _broadcast_tensors(comm: comm_mod.Communicator, tensors: list[torch.Tensor], root: int = 0) -> None:
    """Broadcast many tensors with one collective per device: a broadcast moves bytes, so every dtype shares
    one buffer (each piece 8-byte aligned). A BatchNorm model's buffers (float statistics, an int64 count) so
    take one collective a forward where one per dtype took two, each a wake-up of Gloo's threads."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault(t.device, []).append(t)
    for group in groups.values():
        sizes = [t.numel() * t.element_size() for t in group]
        starts = list(itertools.accumulate([0] + [-(-n // 8) * 8 for n in sizes]))
        flat = torch.zeros(starts[-1], dtype=torch.uint8, device=group[0].device)
        with torch.no_grad():
            for t, start, n in zip(group, starts, sizes):
                flat[start: start + n].view(t.dtype).copy_(t.detach().reshape(-1))
            comm.broadcast(flat, root=root)
            for t, start, n in zip(group, starts, sizes):
                t.copy_(flat[start: start + n].view(t.dtype).view_as(t))


class DataParallel(torch.nn.Module):
    """Wrap a model for data-parallel training across all ranks of the job.

    On wrapping: checks that every rank holds the same parameter layout, then
    copies rank 0's parameters and buffers to all ranks. On every backward:
    bucketed, overlapped allreduce of the gradients, averaged. Use any optimizer
    on ``model.parameters()`` as usual.

    >>> import gpurig, torch
    >>> comm = gpurig.init()
    >>> model = gpurig.DataParallel(torch.nn.Linear(4, 2))
    >>> model(torch.ones(8, 4)).sum().backward()      # gradients are now averaged
    >>> with model.no_sync():                          # accumulate locally, no communication
    ...     model(torch.ones(8, 4)).sum().backward()

    ``compression`` sends float32 gradients compressed, with error feedback:
    ``"fp16"``, ``"bf16"``, ``"int8"``, ``"int8-dynamic"`` as a reduce-scatter
    and allgather of compressed chunks, ``"powersgd"`` (or ``"powersgd:R"``) as
    rank-R factors. ``"auto"`` measures the first steps uncompressed, then
    picks each bucket's method from the measured network and codec costs, and
    decides again when the wait at backward's end moves: the link or the load changed (:mod:`gpurig.parallel.auto`);
    ``"auto:fp16,int8"`` picks among those methods (and none) only.

    ``shard="optimizer"`` (ZeRO stage 1) or ``"gradients"`` (stage 2) reduce-scatters
    each bucket instead, so each rank gets the average of its 1/N shard only, and
    needs its optimizer wrapped in :class:`~gpurig.parallel.zero_optimizer.ZeroRedundancyOptimizer`,
    which updates that shard with 1/N of the optimizer state and allgathers the
    parameters after each step (:mod:`gpurig.parallel.zero`).

    ``nonfinite`` is what a NaN or Inf in the averaged gradients does
    (:mod:`gpurig.parallel.numerics`): ``"stop"`` (default) raises
    :class:`NonFiniteGradientError` from ``backward()`` naming the parameter;
    ``"skip"`` drops the step's gradients, so the optimizer's ``step()`` leaves
    the weights alone, and sets :attr:`finite` False; ``"ignore"`` does not look.

    A parameter a rank's forward did not use is averaged as zeros from that
    rank, which is exact while some rank used it. ``find_unused_parameters=True``
    (DDP's name) also leaves ``grad`` None where no rank used it, as torch does
    in one process, so momentum and weight decay leave it alone: one small
    allreduce a step. Left False, such a parameter gets a zero gradient and a
    warning names it once.
    """

    # Where the guard's flag rides in each uncompressed bucket (numerics.copy_flagged: one pass in C on host
    # memory). On a GPU it would cost three more kernels per parameter and a synchronisation per bucket; there,
    # as for compressed buckets, one sum per averaged bucket is checked, one synchronisation a step.
    flag_devices: tuple[str, ...] = ("cpu",)

    def __init__(self, module: torch.nn.Module, comm: comm_mod.Communicator | None = None,
                 bucket_cap_mb: float | None = None, broadcast_buffers: bool = True,
                 compression: str = "none", nonfinite: str = "stop", shard: str = "none", timeline=None,
                 find_unused_parameters: bool = False):
        super().__init__()
        if bucket_cap_mb is not None and not 0 < bucket_cap_mb < math.inf:  # NaN fails both
            raise ValueError(f"bucket_cap_mb must be a positive, finite number of MB, got {bucket_cap_mb}")
        compression = "none" if compression is None else compression   # as Horovod's Compression.none
        self.nonfinite = numerics.check_action(nonfinite)
        self.finite = True  # whether the last backward's averaged gradients were all finite
        self._candidates = auto.parse(compression)  # ValueError naming the choices
        if self._candidates is None:
            parse_method(compression)  # ValueError naming the choices
        self.shard = zero.check_shard(shard, compression)  # ValueError naming what cannot be sharded
        if find_unused_parameters and self.shard != "none":
            raise ValueError("find_unused_parameters=True does not work with shard: a sharded optimizer steps "
                             "every parameter of its shard")
        self.find_unused_parameters = find_unused_parameters
        self.compression = compression
        self.auto = self._candidates is not None
        self.auto_choice: dict | None = None
        self.module = module
        self.comm = comm or comm_mod.current()
        self.zero = None
        # a parallel.timeline.Timeline recording each bucket and the wait for them, or None: the one recording now
        self.timeline = timeline
        self.broadcast_buffers = broadcast_buffers
        self.stats = CommStats()
        self._sync = True
        self._finalize_queued = False
        self._next_bucket = 0
        self._inline_s = 0.0   # this step's last bucket, allreduced blocking (_inline)
        self._checked = False  # this step's collective check begun at backward's first gradient (expect_async)
        self._recent: collections.deque = collections.deque(maxlen=AUTO_CALIBRATION_STEPS)
        self._method_costs: list[dict] | None = None
        self._finished_at = 0.0  # when the last step's gradients were averaged
        self._trials: list[list[str]] = []  # assignments auto times in real steps before settling
        self._trial_times: list[list[float]] = []
        self.auto_review_steps = AUTO_REVIEW_STEPS
        self._reviewed_at = 0         # the step auto last reviewed its choice at
        self._settled_s: float | None = None  # the wait at backward's end once the last decision settled
        self._drifts = 0              # reviews in a row that found the wait moved (auto.drifted)
        self._decided_from: list[str] = []  # the methods before the last decision

        if self.comm.size > 1:
            check_same_model(self.comm, module)  # which parameters train too: every rank then agrees below
        if not any(p.requires_grad for p in module.parameters()):  # DDP refuses it too
            raise ValueError("DataParallel: the model has no parameter that requires a gradient, so there is nothing "
                             "to average: run it without DataParallel")
        sparse = next((name for name, m in module.named_modules()
                       if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse), None)
        if sparse is not None:
            raise ValueError(f"DataParallel: {sparse!r} makes sparse gradients (sparse=True), which the buckets do not "
                             f"carry: build it with sparse=False")
        if self.comm.size > 1:
            _broadcast_tensors(self.comm, [p.data for p in module.parameters()] + list(module.buffers()))

        self._params = [p for p in module.parameters() if p.requires_grad]
        self._names = {id(p): name for name, p in module.named_parameters()}
        # which parameters train, as wrapped: the buckets and hooks hold those (:meth:`_check_trains`)
        self._all_params = list(module.parameters())
        self._trains = [p.requires_grad for p in self._all_params]
        self._announced: tuple = ((), [])  # (bucket methods, the signatures announced for them)
        # begun on the background thread, not yet finished
        self._in_flight: CompressedAverage | powersgd.LowRankAverage | None = None
        if self.compresses and any(p.dtype != torch.float32 for p in self._params):
            raise ValueError(f"compression {compression!r} needs float32 parameters")
        self._bucket_cap_mb = bucket_cap_mb
        # find_unused_parameters: which parameters some rank gave a gradient this step (summed over the ranks)
        self._used = self._params[0].new_ones(len(self._params), dtype=torch.float32) \
            if find_unused_parameters and self._params else None
        self._position = {id(p): i for i, p in enumerate(self._params)}
        self._no_gradient: list[str] | None = []  # names this rank had no gradient for, until said once
        self._build_buckets()
        # ZeRO: reduce-scatter, this rank's shard of the gradients, parameters allgathered after the step
        self.zero = zero.ShardedBuckets(self.buckets, self.comm, self.shard, self.stats) if self.shard != "none" else None
        if self.zero is not None:   # the shards' allgather records on the same timeline
            self.zero.timeline_of = lambda: self.timeline
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in self._params]
        self._engine_moves_itself = getattr(self.comm.engine, "native_async", False)

    @property
    def timeline(self):
        """The :class:`~gpurig.parallel.timeline.Timeline` recording each bucket and the waits: the one given, else
        the one a ``with gpurig.timeline(...)`` block records now (a model wrapped before the block records in
        it too), else None (off: nothing recorded)."""
        return self._timeline if self._timeline is not None else timeline_mod.current()

    @timeline.setter
    def timeline(self, value) -> None:
        self._timeline = value

    @property
    def compresses(self) -> bool:
        """Whether gradients may travel compressed (and per-rank residuals need saving with checkpoints)."""
        return self.compression != "none"

    @property
    def methods(self) -> list[str]:
        """How each bucket travels now, in bucket order.

        >>> gpurig.DataParallel(torch.nn.Linear(4, 2), compression="int8").methods   # doctest: +SKIP
        ['int8']
        """
        return [b.method for b in self.buckets]

    def _build_buckets(self) -> None:
        """Group the parameters into buckets: ``bucket_cap_mb``, else 25 MB, or 4 MB when compressing."""
        cap_mb = self._bucket_cap_mb or (COMPRESSED_BUCKET_MB if self.compresses else DEFAULT_BUCKET_MB)
        self.buckets: list[Bucket] = []
        self._bucket_of: dict[int, int] = {}
        caps = int(cap_mb * 2**20), int(FIRST_BUCKET_MB * 2**20)
        method = "none" if self.auto else self.compression
        # the guard's flag rides in the allreduce (numerics.copy_flagged); compressed and sharded buckets are summed
        flagged = (not self.compresses and self.shard == "none" and self.nonfinite != "ignore"
                   and self._params[0].device.type in self.flag_devices)
        for b, indices in enumerate(assign_buckets(self._params, *caps)):
            params = [self._params[i] for i in indices]
            offsets, total = [], 0
            for p in params:
                offsets.append(total)
                total += p.numel()
            # Padded to whole compressed chunks, so no method needs a copy (a few KB of zeros at most).
            length = padded_bucket_length(total, self.comm.size, "int8") if self.compresses else total + flagged
            self.buckets.append(Bucket(params, params[0].new_zeros(length), offsets, method=method, flagged=flagged))
            for p in params:
                self._bucket_of[id(p)] = b

    # -- the training-step machinery ----------------------------------------
    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():
            self._check_trains()
            # as DDP: only a forward that will train syncs them, so one rank may evaluate alone under no_grad()
            if self.broadcast_buffers:
                self.sync_buffers()
        return self.module(*args, **kwargs)

    def _check_trains(self) -> None:
        """Refuse a parameter frozen or unfrozen since wrapping: its gradient would not be averaged (the ranks
        drift apart) or would still be set (momentum and weight decay move a frozen weight). DDP has the same
        rule; a loop over the flags costs a few µs a step."""
        if [p.requires_grad for p in self._all_params] == self._trains:
            return
        p = next(p for p, was in zip(self._all_params, self._trains) if p.requires_grad != was)
        change = "unfrozen (requires_grad set)" if p.requires_grad else "frozen (requires_grad cleared)"
        raise ValueError(f"DataParallel: parameter {self._names.get(id(p), '?')!r} was {change} after the model was "
                         f"wrapped, and the buckets hold the parameters that trained then; set requires_grad before "
                         f"wrapping, or wrap again after the change: model.remove_hooks(); "
                         f"model = gpurig.DataParallel(model.module)")

    def sync_buffers(self) -> None:
        """Copy rank 0's buffers (BatchNorm's running statistics) to every rank; every rank must call it.
        A forward with grad enabled does it first (``broadcast_buffers``); call it before an evaluation on every
        rank under ``torch.no_grad()`` for rank 0's statistics everywhere.

        >>> model.sync_buffers()            # doctest: +SKIP
        """
        buffers = list(self.module.buffers()) if self.comm.size > 1 else []
        if buffers:
            _broadcast_tensors(self.comm, buffers)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block backward only accumulates gradients locally (for gradient accumulation).

        The next backward outside the block averages the accumulated gradients.

        >>> with model.no_sync():                  # doctest: +SKIP
        ...     model(x1).sum().backward()
        >>> model(x2).sum().backward()            # averages the sum of both  # doctest: +SKIP
        """
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        if not self._sync or (self.comm.size == 1 and self.zero is None):
            return
        if not self._finalize_queued:
            self._finalize_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish_backward)
            # The step's collective check leaves now and travels while backward computes; it is judged before
            # the first bucket's data moves (gpurig.comm.guard). Blocking at the first bucket, it was a rendezvous
            # with the other ranks on the critical path (docs/benchmarks.md, issue 23's third pass).
            self._checked = self.comm.expect_async(self._step_signatures())
        bucket = self.buckets[self._bucket_of[id(param)]]
        bucket.ready += 1
        # what was begun on this thread moves only inside engine calls (MPI); Gloo's and NCCL's threads move
        # theirs, and a posted check is judged when the first bucket begins (a call a gradient costs CNNs' many
        # small parameters 1 % of their step over Gloo)
        if (self._next_bucket or self._checked) and not self._engine_moves_itself:
            self.comm.progress()
        while self._next_bucket < len(self.buckets) and self._bucket_full(self.buckets[self._next_bucket]):
            self._launch(self.buckets[self._next_bucket])
            self.stats.launched_in_backward += 1

    def _note_no_gradient(self, param: torch.Tensor) -> None:
        """``param`` reached this step's buckets with no gradient on this rank: note it for
        ``find_unused_parameters``, or say once what its zeros do when no rank used it."""
        if self._used is not None:
            self._used[self._position[id(param)]] = 0.0
        elif self._no_gradient is not None:
            self._no_gradient.append(self._names.get(id(param), "?"))

    def _unused_everywhere(self) -> set[int]:
        """The ids of the parameters no rank gave a gradient this step (``find_unused_parameters`` only); without
        it, the first step some parameter had none here says so, once."""
        if self._used is None:
            if self._no_gradient:
                names = ", ".join(repr(n) for n in self._no_gradient[:3]) + \
                    (f" and {len(self._no_gradient) - 3} more" if len(self._no_gradient) > 3 else "")
                self._no_gradient = None
                warnings.warn(f"DataParallel: no gradient on rank {self.comm.rank} for {names}: averaged as zeros, "
                              f"so where no rank used them, momentum and weight decay still move them. "
                              f"DataParallel(find_unused_parameters=True) (gpurig train --find-unused-parameters) "
                              f"leaves their grad None, as torch does, at one small allreduce a step", UserWarning,
                              stacklevel=3)
            return set()
        nobody = {id(self._params[i]) for i in torch.nonzero(self._used == 0).flatten().tolist()}
        self._used.fill_(1.0)  # the next step marks only what it misses
        return nobody

    @staticmethod
    def _bucket_full(bucket: Bucket) -> bool:
        return bucket.ready == len(bucket.params)

    def _step_signatures(self) -> list[Signature]:
        """Every collective of this step's backward, in order: the buckets', or ZeRO's."""
        return self._signatures() if self.zero is None else \
            self.zero.signatures(self.methods, check_finite=self.nonfinite != "ignore")

    def _signatures(self) -> list[Signature]:
        """What this step's buckets submit, in the order they do.

        A compressed bucket's second half is submitted after the next compressed
        bucket has begun (see :meth:`_launch`), the last one's at the end.
        """
        methods = tuple(self.methods)
        if self._announced[0] != methods:
            order, pending = [], []
            for i, (bucket, method) in enumerate(zip(self.buckets, methods)):
                n = len(bucket.flat) if method != "none" else len(bucket.travelling)
                begun, finished = collectives(n, self.comm.size, method, f"bucket {i}", bucket.shapes,
                                              bucket.travelling.dtype)
                order += begun
                if method != "none":
                    order, pending = order + pending, finished
            used = [Signature.of("allreduce", self._used, "used parameters", "sum")] if self._used is not None else []
            self._announced = (methods, order + pending + used)
        return self._announced[1]

    @property
    def _pipelined(self) -> bool:
        """Whether compressed buckets overlap (some bucket compresses)."""
        return any(m != "none" for m in self.methods)

    def _launch(self, bucket: Bucket) -> None:
        # Launch order is the bucket order on every rank, whatever order autograd finished in.
        # Uncompressed, dividing by the rank count while copying in saves a pass (DDP does the same).
        index, copy_started = self._next_bucket, time.perf_counter()
        if index == 0 and not self._checked:  # one check of the step's collectives against the other ranks'
            self.comm.expect(self._step_signatures())
        if self.zero is not None:
            self.zero.launch(bucket, index, inline=bucket.method == "none" and self._inline(index))
            self._next_bucket += 1
            return
        plain = bucket.method == "none"
        scale = 1.0 / self.comm.size if plain else 1.0
        with torch.no_grad():
            flag = bucket.flag
            if flag is not None:
                flag.zero_()
            for p, piece in zip(bucket.params, bucket.views()[0]):
                if p.grad is None:
                    piece.zero_()
                    self._note_no_gradient(p)
                elif flag is not None:
                    numerics.copy_flagged(p.grad, piece, scale, flag)
                else:
                    torch.mul(p.grad.reshape(-1), scale, out=piece)
            if plain and bucket.state.sent is not None:  # what an earlier lossy method still owes, paid once
                bucket.flat.add_(bucket.state.sent, alpha=scale)
                bucket.state = FeedbackState()
        bucket.launched_at = time.perf_counter()
        self._record("copy in", copy_started, bucket.launched_at, index)
        name = f"bucket {index}"
        pipelined = self._pipelined
        known = self._plain(bucket, index) if plain else None
        if plain and not pipelined and self._inline(index):
            self.comm.allreduce(known.tensor, op="sum", name=name)
            bucket.handle = None
            # nothing hides it: backward's end would have waited this long for it (auto reads it as exposed),
            # and it had no time to hide under (auto's lead: from here to backward's end)
            done = time.perf_counter()
            self._record("allreduce", bucket.launched_at, done, index, exposed=True)
            self._inline_s += done - bucket.launched_at
            bucket.launched_at = done
        elif plain and known.prepared is not None and not pipelined:
            bucket.handle = self.comm.start_prepared(known.prepared)
        elif plain and not pipelined:
            bucket.handle = self.comm.allreduce_async(known.tensor, op="sum", name=name)
        elif plain:  # on the background thread too, so its place among the compressed buckets' is the same everywhere
            bucket.handle = self.comm.run_async(lambda: self.comm.allreduce(known.tensor, "sum", name))
        else:
            bucket.handle = self.comm.run_async(lambda: self._begin_compressed(bucket, name))
        if plain:
            self.stats.bytes_sent += known.sent
        self._next_bucket += 1

    lean_launch = True  # False: every bucket through allreduce_async's whole path (before issue 23's eighth pass)

    def _plain(self, bucket: Bucket, index: int) -> PlainLaunch:
        """Bucket ``index``'s uncompressed allreduce as the step begins it: worked out at its first step, and again
        only when its layout changes (``flat`` replaced), not at every step as ``allreduce_async`` does. It is
        still checked against the other ranks' at every step (:meth:`Communicator.start_prepared`)."""
        known = bucket.plain_launch
        if known is None or known.tensor is not bucket.travelling:
            tensor = bucket.travelling
            prepared = self.comm.prepare_allreduce(tensor, name=f"bucket {index}") if self.lean_launch else None
            known = bucket.plain_launch = PlainLaunch(tensor, prepared, wire_bytes("none", bucket.shapes, self.comm.size))
        return known

    last_bucket_inline = True

    def _inline(self, index: int) -> bool:
        """Whether bucket ``index`` is allreduced right here, blocking: the last bucket, over an engine whose
        nonblocking collectives move only inside its calls (MPI), when the ranks span nodes. Nothing is left to
        hide it under: behind an emulated 1 Gbit/s link the uncompressed MLP step took 148 ms so, 177 ms with an
        ``Iallreduce``; within one node (shared memory) the ``Iallreduce`` made the step 1.09–1.16x faster
        (docs/benchmarks.md)."""
        return (self.last_bucket_inline and index == len(self.buckets) - 1 and self.comm.local_size < self.comm.size
                and not getattr(self.comm.engine, "native_async", False))

    def _begin_compressed(self, bucket: Bucket, name: str) -> None:
        """Begin this bucket's compressed average, then finish the one before: the link has this one's pieces
        to carry while the earlier one's are decoded, averaged and sent back."""
        started = time.perf_counter()
        begun = begin_average(self.comm, bucket.flat, bucket.method, bucket.state, bucket.shapes, name)
        begun.bucket_index = self.buckets.index(bucket) if self.timeline is not None else None
        self._record(f"encode + send ({bucket.method})", started, time.perf_counter(), begun.bucket_index)
        self._finish_in_flight()
        self._in_flight = begun
        scattered = getattr(begun, "scattered", None)  # an element-wise codec's pieces (PowerSGD's are not)
        if scattered and bucket is not self.buckets[-1] and self.keep_moving:
            # MPI moves bytes only inside its calls, and nothing calls it until the next bucket is handed over
            # (behind a slow link, backward's end): keep this bucket's pieces moving meanwhile. (Not its average
            # sent back early: whether the next bucket is here yet differs across ranks, and the collectives'
            # order must not.)
            self.comm.keep_moving(scattered)

    keep_moving = True  # False: leave a compressed bucket's pieces until the next bucket (before issue 23's fourth pass)

    def _finish_in_flight(self) -> None:
        pending, self._in_flight = self._in_flight, None
        if pending is not None:
            started = time.perf_counter()
            self.stats.bytes_sent += pending.finish()
            self._record("receive + decode", started, time.perf_counter(), getattr(pending, "bucket_index", None))

    def _record(self, name: str, start: float, end: float, index: int | None, exposed: bool = False) -> None:
        """Bucket ``index``'s event on its row of the timeline (``exposed``: the main thread waited meanwhile)."""
        if self.timeline is None or index is None:
            return
        self.timeline.add(name, start, end, bucket_thread(index), cat="bucket", bucket=index,
                          method=self.buckets[index].method)
        if exposed:
            self.timeline.exposed(start, end)

    def _finish_backward(self) -> None:
        self._finalize_queued = False
        while self._next_bucket < len(self.buckets):  # parameters that got no gradient this step
            self._launch(self.buckets[self._next_bucket])
            self.stats.launched_at_end += 1
        last = self.comm.run_async(self._finish_in_flight) if self._pipelined else None
        start = time.perf_counter()
        try:
            for index, bucket in enumerate(self.buckets):
                if bucket.handle is not None:  # None: allreduced in place already (_inline)
                    bucket.handle.wait()
                    if bucket.method == "none":  # a compressed bucket records its own halves
                        self._record("allreduce" if self.zero is None else "reduce-scatter", bucket.launched_at,
                                     time.perf_counter(), index)
            if last is not None:
                last.wait()
            if self._used is not None:  # after every bucket's collectives, on every rank
                self.comm.allreduce(self._used, op="sum", name="used parameters")
        except BaseException:
            self._in_flight, self._inline_s = None, 0.0  # a failed step leaves nothing half-counted for the next
            raise
        end = time.perf_counter()
        inline, self._inline_s = self._inline_s, 0.0
        waited = end - start + inline
        # backward still to run after each bucket left (auto's lead): the last bucket's blocking allreduce
        # (_inline) ran after the earlier ones left, but it is communication, not backward to hide them under
        leads = [start - b.launched_at - inline for b in self.buckets[:-1]] + [start - self.buckets[-1].launched_at]
        if self.zero is not None:  # this rank's shard of the average goes to the optimizer's segments
            self.zero.finish()
        if self.timeline is not None:
            self.timeline.exposed(start, end)
        # The averaged gradients stay in the buckets: each param.grad becomes a view of its
        # bucket (DDP's gradient_as_bucket_view), so there is no copy back and no second copy.
        unused = self._unused_everywhere()
        for bucket in self.buckets:
            if self.zero is None:
                for p, grad in zip(bucket.params, bucket.views()[1]):
                    p.grad = None if id(p) in unused else grad
            bucket.ready = 0
            bucket.handle = None
        self._next_bucket, self._checked = 0, False
        self.stats.steps += 1
        self.stats.exposed_s += waited
        self.stats.last_exposed_s = waited
        if self.nonfinite != "ignore":
            self._guard_numerics()
        if self.auto:
            now, previous = time.perf_counter(), self._finished_at
            self._finished_at = now
            if self._trials:  # from one step's averaged gradients to the next: the optimizer, forward, backward
                self._trial_step(now - previous)
                return
            self._recent.append([waited] + leads)
            if self.auto_choice is None:
                # the steps seen here, not the run's: a run resumed before the choice counts its own again
                if len(self._recent) == self._recent.maxlen:
                    self._choose_methods("calibrated")
            elif (self.stats.steps - self._reviewed_at >= self.auto_review_steps
                  and len(self._recent) == self._recent.maxlen):
                self._review()

    # -- the numerical guard ---------------------------------------------------
    def _guard_numerics(self) -> None:
        """One sum per bucket; on NaN or Inf, stop (raise) or skip (drop the gradients), naming the parameter."""
        if self.zero is not None:  # each rank holds its shard: they agree with one tiny allreduce
            self.finite, bad = self.zero.all_finite(self._names)
            bad = bad or ("a parameter", "NaN or Inf")
        else:  # a bucket no rank flagged is finite (numerics.copy_flagged); the others are summed
            self.finite = numerics.all_finite([b.flat[: b.numel] for b in self.buckets
                                               if not b.flagged or b.flat[b.numel].item() != 0])
            bad = None if self.finite else \
                numerics.first_nonfinite([(self._names.get(id(p), "?"), p.grad) for p in self._params])
        if self.finite:
            return
        if bad is None:  # the sums overflowed, the values are finite
            self.finite = True
            return
        name, what = bad
        text = f"step {self.stats.steps}: the averaged gradient of {name!r} holds {what}"
        carried = next((self.buckets[self._bucket_of[id(p)]].method for p in self._params
                        if self._names.get(id(p)) == name and id(p) in self._bucket_of), None)
        if carried == "fp16" and what == "Inf":  # the codec's range, not necessarily the gradient (a NaN is not
            # an overflow: it was there before it travelled): say which
            text += (" (it travelled as fp16, whose largest value is 65504: a larger gradient overflows on the way; "
                     "compression 'bf16' or 'int8' carries it)")
        if self.nonfinite == "stop":
            raise numerics.NonFiniteGradientError(
                f"{text}; stopping (DataParallel(nonfinite='skip') would skip such steps)",
                step=self.stats.steps, parameter=name, kind=what)
        for p in self._params:  # no gradient, no update: any torch optimizer's step() leaves the weights alone
            p.grad = None
        if self.zero is not None:
            self.zero.drop_gradients()
        self.drop_nonfinite_feedback()
        self.stats.skipped_steps += 1
        warnings.warn(f"{text}; step skipped", numerics.NonFiniteGradientWarning, stacklevel=2)

    def drop_nonfinite_feedback(self) -> None:
        """Zero what a skipped step left NaN or Inf between steps — the error-feedback residuals, a compressed
        bucket's padding — else every later step inherits it. The step's gradients are dropped with it.

        >>> model.drop_nonfinite_feedback()     # after a step skipped for NaN or Inf   # doctest: +SKIP
        """
        for bucket in self.buckets:
            if not bool(torch.isfinite(bucket.flat).all()):
                bucket.flat.zero_()
            state = bucket.state
            for tensor in (state.sent, state.owned):
                if tensor is not None and not bool(torch.isfinite(tensor).all()):
                    tensor.zero_()
            if state.lowrank and not all(bool(torch.isfinite(q).all()) for q in state.lowrank):
                state.lowrank = None  # PowerSGD starts its factors afresh (they are averaged: the same on every rank)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the averaged gradients so that their norm over the whole model is at most ``max_norm``; return
        that norm before clipping (``torch.nn.utils.clip_grad_norm_``, FSDP's ``model.clip_grad_norm_``).

        Call it after ``backward()``, before the optimizer's step. With ``shard=...`` each rank holds only its
        shard of the gradients (``param.grad`` is None), so torch's own function would find nothing to clip:
        this one sums every rank's part of the norm (one tiny collective) and scales each shard.

        >>> loss.backward(); model.clip_grad_norm_(1.0); optimizer.step()     # doctest: +SKIP
        tensor(3.2160)
        """
        if self.zero is None:   # every rank holds the same averaged gradients
            return torch.nn.utils.clip_grad_norm_(self._params, max_norm, norm_type)
        return self.zero.clip_grad_norm_(float(max_norm), float(norm_type))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """``optimizer.step()`` unless the last backward's gradients held NaN or Inf; return whether it stepped.

        >>> loss.backward(); model.step(optimizer)     # doctest: +SKIP
        True
        """
        if not self.finite:
            return False
        optimizer.step()
        return True

    # -- compression="auto" ---------------------------------------------------
    def _review(self) -> None:
        """Compare the last steps' wait at backward's end with the wait once the last decision settled; decide
        again when it moved (:func:`gpurig.parallel.auto.drifted`) at two reviews in a row: the link or the
        load changed. One small allgather; every rank reviews at the same step and reaches the same verdict."""
        self._reviewed_at = self.stats.steps
        mine = torch.tensor([[statistics.median(row[0] for row in self._recent)]], dtype=torch.float64)
        wait = self.comm.allgather(mine).min().item()  # the rank that finished backward last waited only for the link
        if self._settled_s is None:
            self._settled_s = wait
            return
        self._drifts = self._drifts + 1 if auto.drifted(self._settled_s, wait) else 0
        if self._drifts >= 2:
            self._choose_methods(f"the wait at backward's end moved from {1000 * self._settled_s:.1f} to "
                                 f"{1000 * wait:.1f} ms")

    def _settle(self) -> None:
        """The choice is made (and its trials run): measure its wait afresh; review less often if nothing changed."""
        self._recent.clear()
        self._settled_s, self._drifts, self._reviewed_at = None, 0, self.stats.steps
        if self.auto_choice.get("decisions", 1) > 1 and self.methods == self._decided_from:
            self.auto_review_steps = min(2 * self.auto_review_steps, AUTO_REVIEW_MAX_STEPS)

    def _measure_method_costs(self) -> list[dict]:
        """Seconds of codec arithmetic each candidate method costs each bucket on this device, timed now."""
        costs = []
        for bucket in self.buckets:
            row = {"none": 0.0}
            for method in self._candidates[1:]:
                kind, rank = parse_method(method)
                if kind == POWERSGD:
                    if powersgd.split(bucket.shapes, rank)[0]:
                        row[method] = powersgd.local_seconds(bucket.shapes, rank, bucket.flat.device)
                else:
                    row[method] = codecs.cost_seconds(codecs.get(kind), bucket.flat.numel(), self.comm.size,
                                                      bucket.flat.device)
            costs.append(row)
        return costs

    def _collective_latency(self) -> float:
        """Seconds one tiny allreduce takes here: the least of a few, since a rank that waits for its peer to be
        scheduled on a busy CPU adds time the link does not (the median read 16 ms at load 10 on 2 cores,
        behind a 100 Mbit/s link, where the link's own latency is well under 1 ms)."""
        probe, times = torch.zeros(2), []
        for _ in range(9):
            begin = time.perf_counter()
            self.comm.allreduce(probe, op="sum")
            times.append(time.perf_counter() - begin)
        return min(times)

    def _link_bandwidth(self, latency_s: float) -> float:
        """Bytes per second the link carries: the largest bucket allreduced on its own (best of two), now."""
        largest = max(self.buckets, key=lambda b: b.numel)
        probe, times = largest.flat.new_zeros(largest.numel), []
        for _ in range(2):
            self.comm.barrier()
            begin = time.perf_counter()
            self.comm.allreduce(probe, op="sum")
            times.append(time.perf_counter() - begin)
        return wire_bytes("none", largest.shapes, self.comm.size) / max(min(times) - latency_s, 1e-9)

    def _chain_seconds(self) -> tuple[int, list[float]]:
        """The largest bucket, and each candidate's whole average of it timed here (best of two; NaN: unusable).

        Each run starts after a barrier, on the communication thread, on a copy
        of the bucket's last gradients with a state of its own, so training's
        residuals and factors are untouched.
        """
        index = max(range(len(self.buckets)), key=lambda b: self.buckets[b].numel)
        bucket, seconds = self.buckets[index], []
        for method in self._candidates:
            if method == "none" or method not in self._method_costs[index]:
                seconds.append(float("nan"))
                continue
            state = FeedbackState()
            seconds.append(min(timed_average(self.comm, bucket.flat.clone(), method, state, bucket.shapes)
                               for _ in range(2)))
        return index, seconds

    def _choose_methods(self, reason: str) -> None:
        """Pick each bucket's method from measurements (every rank reaches the same choice), then time the
        shortlist (:func:`gpurig.parallel.auto.shortlist`) in the next steps and keep the fastest.

        The link's latency and bandwidth are measured directly (tiny allreduces,
        and the largest bucket allreduced alone); when each bucket leaves comes
        from the recent steps; each method's codec cost was timed once; each
        method's whole chain is timed on the largest bucket, and the model's
        link time scaled to it (:func:`gpurig.parallel.auto.link_scale`). The wait
        the steps saw at the end of backward (median over the steps, least over
        the ranks: the rank that finished backward last waited only for the
        network) is kept, with the bandwidth that would explain it, to show how
        well the model fits.
        """
        self._method_costs = self._measure_method_costs()  # again at every decision: the load may have changed
        recent = torch.tensor(list(self._recent)[1:] if self.auto_choice is None else list(self._recent),
                              dtype=torch.float64)
        methods = list(self._candidates)
        latency_here = self._collective_latency()
        link = [latency_here, self._link_bandwidth(latency_here)]
        largest, chains = self._chain_seconds()
        mine = torch.cat([recent.median(dim=0).values, torch.tensor(link, dtype=torch.float64),
                          torch.tensor([[c.get(m, float("nan")) for m in methods] for c in self._method_costs],
                                       dtype=torch.float64).view(-1), torch.tensor(chains, dtype=torch.float64)])
        everyone = self.comm.allgather(mine.view(1, -1))
        buckets_n, methods_n = len(self.buckets), len(methods)
        exposed = everyone[:, 0].min().item()
        leads = everyone[:, 1: 1 + buckets_n].mean(dim=0).tolist()
        latency = everyone[:, 1 + buckets_n].mean().item()
        bandwidth = everyone[:, 2 + buckets_n].mean().item()
        costs = everyone[:, 3 + buckets_n: -methods_n].mean(dim=0).view(buckets_n, methods_n)
        chain_s = dict(zip(methods, everyone[:, -methods_n:].max(dim=0).values.tolist()))  # the slowest rank's
        model = []
        for bucket, lead, cost in zip(self.buckets, leads, costs.tolist()):
            usable = [m for m, c in zip(methods, cost) if c == c]  # NaN: not possible for this bucket
            model.append(auto.Bucket(
                lead_s=max(lead, 0.0),
                wire_bytes={m: wire_bytes(m, bucket.shapes, self.comm.size) for m in usable},
                collectives={m: 1 if m == "none" else 2 for m in usable},
                compute_s={m: c for m, c in zip(methods, cost) if m in usable}))
        timed_on = model[largest]
        scales = {m: auto.link_scale(chain_s[m], timed_on.compute_s[m], latency, timed_on.collectives[m],
                                     timed_on.wire_bytes[m], bandwidth) for m in timed_on.compute_s}
        model = [dataclasses.replace(bucket, link_scale=scales) for bucket in model]
        on_cores = self.buckets[0].flat.device.type == "cpu"
        explaining = auto.fit_bandwidth(model, self.methods, latency, exposed, on_cores)
        network = auto.Network(latency, bandwidth)
        chosen, predictions = auto.choose(model, network, on_cores, self._candidates)
        self._decided_from = self.methods
        self._set_methods(chosen)
        decisions = (self.auto_choice or {}).get("decisions", 0) + 1
        self.auto_choice = {"codec": _summary(chosen, self.buckets), "methods": chosen, "step": self.stats.steps,
                            "reason": reason, "decisions": decisions,
                            "exposed_ms": 1000 * exposed, "latency_us": 1e6 * latency,
                            "bandwidth_gbit_s": 8 * bandwidth / 1e9, "explaining_gbit_s": 8 * explaining / 1e9,
                            "link_scale": {m: round(x, 3) for m, x in scales.items()}, **predictions}
        trials = auto.shortlist(model, network, on_cores, chosen, self._candidates)
        if len(trials) > 1:
            self._trials, self._trial_times = trials, [[]]
        else:
            self._settle()

    def _set_methods(self, methods: list[str]) -> None:
        for bucket, method in zip(self.buckets, methods):
            switch_method(bucket.state, bucket.method, method, self.comm.rank, self.comm.size)
            bucket.method = method

    def _trial_step(self, seconds: float) -> None:
        """Count one whole step of the assignment on trial; after the last trial keep the fastest: the model's
        choice unless another was :data:`AUTO_TRIAL_MARGIN` faster (every rank times the same steps and takes
        the slowest rank's medians, so all reach the same choice)."""
        self._trial_times[-1].append(seconds)
        if len(self._trial_times[-1]) < AUTO_TRIAL_STEPS:
            return
        if len(self._trial_times) < len(self._trials):
            self._set_methods(self._trials[len(self._trial_times)])
            self._trial_times.append([])
            return
        mine = torch.tensor([statistics.median(times[1:]) for times in self._trial_times], dtype=torch.float64)
        slowest = self.comm.allgather(mine.view(1, -1)).max(dim=0).values.tolist()
        best = min(range(len(slowest)), key=slowest.__getitem__)
        if slowest[0] <= (1 + AUTO_TRIAL_MARGIN) * slowest[best]:
            best = 0
        methods = self._trials[best]
        self._set_methods(methods)
        self.auto_choice.update(codec=_summary(methods, self.buckets), methods=methods,
                                trials=[{"methods": m, "ms": round(1000 * t, 3)} for m, t in zip(self._trials, slowest)])
        self._trials, self._trial_times = [], []
        self._settle()

    # -- conveniences users of DDP expect ---------------------------------
    def state_dict(self, *args, **kwargs):
        """The wrapped module's state dict (no ``module.`` prefix), so checkpoints load into an unwrapped model."""
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)

    def compression_state_dict(self) -> dict:
        """This rank's compression state — each bucket's method and residuals (they differ per rank) — for checkpoints.

        >>> torch.save(model.compression_state_dict(), f"ef-rank{comm.rank}.pt")   # doctest: +SKIP
        """
        return {"compression": self.compression, "ranks": self.comm.size, "auto_choice": self.auto_choice,
                "steps": self.stats.steps, "methods": self.methods, "trials": self._trials,
                "buckets": [b.state.saved() for b in self.buckets]}

    def compression_state_problem(self, state: dict) -> str | None:
        """Why :meth:`load_compression_state_dict` cannot take ``state`` (another compression, bucket layout or rank
        count), or None.

        >>> model.compression_state_problem(torch.load("ef-rank0.pt"))   # doctest: +SKIP
        "the residuals were saved by compression 'auto', this model sends 'int8'"
        """
        expected = (self.compression, len(self.buckets), self.comm.size)
        found = (state.get("compression"), len(state.get("buckets", [])), state.get("ranks"))
        if found == expected:
            return None
        if found[0] != expected[0]:
            return f"the residuals were saved by compression {found[0]!r}, this model sends {expected[0]!r}"
        return (f"the residuals were saved for {found[1]} buckets on {found[2]} ranks, this model has {expected[1]} "
                f"on {expected[2]}")

    def load_compression_state_dict(self, state: dict) -> None:
        """Restore what :meth:`compression_state_dict` saved (same compression, buckets and rank count)."""
        problem = self.compression_state_problem(state)
        if problem is not None:
            raise ValueError(problem)
        self.auto_choice = state.get("auto_choice")
        self.stats.steps = state.get("steps", 0)
        for bucket, method, saved in zip(self.buckets, state["methods"], state["buckets"]):
            bucket.method = method
            bucket.state.restore(saved)
        # auto's trials under way when it was saved start again from the first (their timings are not kept)
        self._trials = [list(m) for m in state.get("trials", [])]
        self._trial_times = [[]] if self._trials else []
        if self._trials:
            self._set_methods(self._trials[0])

    def remove_hooks(self) -> None:
        """Detach from the module: later backwards no longer communicate."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def _summary(methods: list[str], buckets: list[Bucket]) -> str:
    """One word for a per-bucket choice: the method that carries most of the gradients."""
    carried: dict = {}
    for method, bucket in zip(methods, buckets):
        carried[method] = carried.get(method, 0) + bucket.numel
    return max(carried, key=carried.get)
