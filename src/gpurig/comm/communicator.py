"""The Communicator: what training code calls, whatever engine moves the bytes.

It owns three things the engines should not repeat: checking arguments,
averaging, and running collectives asynchronously. A blocking collective runs on
the caller's thread. An asynchronous one is begun on the caller's thread with
the engine's own nonblocking operation where it has one (MPI ``Iallreduce`` /
``Iallgather`` / ``Ialltoall``, torch.distributed's ``async_op``) and finishes
when its handle is waited on; Open MPI moves such a collective only inside MPI
calls, so callers that keep computing test their handles now and then
(:meth:`Communicator.progress`; DataParallel does at each gradient that
arrives after its first bucket has left).
No Python thread wakes up for it: on CPU ranks such a thread's wake-up cost
milliseconds per bucket and its work shared the cores with backward
(docs/benchmarks.md). Only what has no nonblocking form (a compressed
average's chain of collectives, :meth:`Communicator.run_async`, MPI's
reduce-scatter and broadcast) runs in order on one background thread, as
Horovod's background loop does; a blocking call first waits for the queued
ones, keeping every rank's sequence of collectives identical.

Every collective passes the :class:`~gpurig.comm.guard.Guard` first: it is
checked against the other ranks' (a :class:`CollectiveMismatchError` on every
rank, not a hang or wrong numbers, when they differ), numbered, and recorded as
the operation in flight for the failure watch. ``name=`` gives a tensor a name
that such messages use, as Horovod's ``name=`` does.
"""

from __future__ import annotations

import contextlib
import functools
import math
import queue
import re
import threading
import time
from concurrent.futures import Future
from typing import Callable, NamedTuple

import torch

from gpurig.comm.guard import CollectiveMismatchError, Guard
from gpurig.errors import CollectiveFailed
from gpurig.comm.signature import Signature

OPS = ("sum", "average")
# An fp16 average is divided before the sum, as NCCL's premultiplied average: two ranks' 40000 sum past fp16's
# largest value (65504) where their mean fits. (bf16 has FP32's range; dividing first would only round more.)
DIVIDE_FIRST = (torch.float16,)


class Handle:
    """A collective in flight, like ``torch.distributed``'s ``Work`` or a Horovod handle.

    >>> handle = comm.allreduce_async(torch.ones(4))   # doctest: +SKIP
    >>> handle.wait()                                   # doctest: +SKIP
    tensor([1., 1., 1., 1.])
    """

    def __init__(self, future: Future | None = None, work=None, finish=None, errors=contextlib.nullcontext):
        self._future, self._work, self._finish, self._errors = future, work, finish, errors
        self._result = None

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """Block until the collective has finished; return its result (re-raising its error). ``timeout``: raise
        ``TimeoutError`` after that many seconds instead (the collective stays in flight: wait again)."""
        if self._future is not None:
            return self._future.result(timeout)
        if self._finish is not None:
            if timeout is not None:
                deadline = time.monotonic() + timeout
                while not self._work.is_completed():  # asking moves an MPI request along, as waiting does
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"the collective did not finish within {timeout:g} s")
                    time.sleep(1e-4)
            with self._errors():
                self._work.wait()
            self._result, self._finish = self._finish(), None
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has finished, successfully or not."""
        if self._future is not None:
            return self._future.done()
        return self._finish is None or self._work.is_completed()


def _completed(result) -> Handle:
    future: Future = Future()
    future.set_result(result)
    return Handle(future)


class _Worker:
    """One background thread that runs queued collectives in submission order."""

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._last: Future | None = None
        self._thread: threading.Thread | None = None

    def submit(self, fn) -> Future:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpurig-comm", daemon=True)
            self._thread.start()
        future: Future = Future()
        self._queue.put((fn, future))
        self._last = future
        return future

    def idle(self) -> bool:
        return self._last is None or self._last.done()

    def nothing_queued(self) -> bool:
        return self._queue.empty()

    def on_worker_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def drain(self) -> None:
        if self._last is not None:
            self._last.exception()  # waits; errors stay with their own handle
            self._last = None

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                with self._lock:
                    result = fn()
            except BaseException as exc:  # handed to whoever waits on the handle
                future.set_exception(exc)
            else:
                future.set_result(result)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None


IN_PLACE = ("allreduce", "broadcast")  # the collectives that write their result into the tensor given


class Communicator:
    """Collectives on torch tensors across all ranks of a job.

    Create it with ``gpurig.init()``. Every operation exists in a blocking form
    and an ``_async`` form returning a :class:`Handle`. All ranks must call the
    same collectives in the same order.

    >>> comm = gpurig.init()                          # doctest: +SKIP
    >>> comm.allreduce(torch.tensor([comm.rank + 1.0]), op="sum")  # doctest: +SKIP
    tensor([3.])                                      # on 2 ranks
    """

    def __init__(self, engine, check: bool = True):
        self.engine = engine
        self._lock = threading.Lock()
        self._worker = _Worker(self._lock)
        self._pinned: dict = {}
        self._started: list[Handle] = []  # begun on the caller's thread, maybe not finished: see progress()
        self._fast_allreduce: dict = {}  # (dtype, shape, name, op) -> Signature of a blocking allreduce seen before
        self.guard = Guard(engine, stage=self._to_engine, check=check)  # host tensors: the same for every kind
        self.watch = None  # the failure watch, started by gpurig.init() (gpurig.comm.watch)

    # -- who am I ---------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def size(self) -> int:
        return self.engine.size

    @property
    def local_rank(self) -> int:
        return self.engine.local_rank

    @property
    def local_size(self) -> int:
        return self.engine.local_size

    @property
    def engine_name(self) -> str:
        return self.engine.name if self.engine.name != "torch" else f"torch/{self.engine.backend}"

    @property
    def device(self) -> torch.device:
        """This rank's device: ``cuda:<local_rank mod GPUs>`` when there are GPUs, else CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def __repr__(self) -> str:
        return f"Communicator(engine={self.engine_name}, rank={self.rank}, size={self.size})"

    # -- plumbing ---------------------------------------------------------
    def _run(self, fn, blocking: bool):
        if self._worker.on_worker_thread():
            # Inside a run_async job: already ordered behind earlier jobs, and holding the lock.
            result = fn()
            return result if blocking else _completed(result)
        if blocking or getattr(self.engine, "native_async", False):
            self._worker.drain()
            with self._lock:
                result = fn()
            return result if blocking else _completed(result)
        self._settle_posted()
        return Handle(self._worker.submit(fn))

    def _guarded(self, signature: Signature, nbytes: int, fn):
        """Run ``fn`` (the engine's part of a collective) after the guard's check, recorded as in flight."""
        try:  # (not `with self._engine_errors()`: this runs for every collective, and a plain try costs nothing)
            self.guard.begin(signature, nbytes)
            try:
                return fn()
            finally:
                self.guard.end()
        except CollectiveMismatchError:
            raise
        except RuntimeError as error:
            raise self._failed(error) from error

    @contextlib.contextmanager
    def _engine_errors(self):
        """An engine error becomes a :class:`CollectiveFailed` naming the collective (and, when the watch
        knows, the rank whose end broke it)."""
        try:
            yield
        except CollectiveMismatchError:
            raise
        except RuntimeError as error:
            raise self._failed(error) from error

    def _failed(self, error: RuntimeError) -> CollectiveFailed:
        cause = self.watch.explain() if self.watch is not None else None
        return CollectiveFailed(f"{self.guard.progress.describe()} failed: {engine_message(error)}"
                                + (f" ({cause})" if cause else ""))

    def expect(self, signatures: list[Signature]) -> None:
        """Check the next collectives (their :class:`Signature` s, in order) against the other ranks' at once.

        They then run without a check each: DataParallel announces its buckets so.
        Every rank must call it at the same point of its sequence of collectives.

        >>> comm.expect([Signature.of("allreduce", b, f"bucket {i}", "sum") for i, b in enumerate(buckets)])  # doctest: +SKIP
        """
        def announce():
            with self._engine_errors():
                self.guard.expect(signatures)

        # One small exchange: on this thread unless queued collectives must go first (a thread hand-off
        # costs more than it does).
        self._run(announce, blocking=self._worker.idle() and not self._worker.on_worker_thread())

    def expect_async(self, signatures: list[Signature]) -> bool:
        """Begin :meth:`expect`'s check without waiting for it; False where it could not be begun so (call
        :meth:`expect` then). It travels while the caller computes and is judged before the first of the
        collectives it announces moves any data (:meth:`progress` judges it earlier once it has arrived).

        >>> comm.expect_async(signatures)     # backward's first gradient: the check leaves   # doctest: +SKIP
        True
        """
        # On this thread only when nothing is queued: a queued job's collectives come first on every rank.
        if not self._worker.idle() or self._worker.on_worker_thread():
            return False
        with self._engine_errors():
            return self.guard.post_expect(signatures)

    def run_async(self, job) -> Handle:
        """Run ``job()`` on the background thread, in order with other asynchronous collectives.

        ``job`` may call this communicator's blocking collectives (a compressed
        allreduce is an all-to-all, some arithmetic, then an allgather); the
        handle's ``wait()`` returns what ``job`` returns.

        >>> handle = comm.run_async(lambda: comm.allreduce(torch.ones(2)))   # doctest: +SKIP
        >>> handle.wait()                                                     # doctest: +SKIP
        tensor([1., 1.])
        """
        self._settle_posted()
        return Handle(self._worker.submit(job))

    def keep_moving(self, handles, nap_s: float = 100e-6) -> bool:
        """Inside a ``run_async`` job: let the engine move ``handles`` until they have all ended (True) or another
        job is queued (False). Open MPI moves a nonblocking collective only inside MPI calls, so a job that
        began one and returned would leave it until the next job's calls; this asks about it between naps of
        ``nap_s`` meanwhile. Engines that move their own (Gloo, NCCL) return at once.

        >>> comm.run_async(lambda: comm.keep_moving([comm.alltoall_async(t)]))   # doctest: +SKIP
        """
        if getattr(self.engine, "native_async", False):
            return all(h.is_completed() for h in handles)
        while not all(h.is_completed() for h in handles):
            if not self._worker.nothing_queued():
                return False
            time.sleep(nap_s)
        return True

    def _settle_posted(self) -> None:
        """Judge a check :meth:`expect_async` began, here, before anything is queued behind it (the guard is
        then touched by one thread at a time)."""
        if self.guard.posted:
            with self._engine_errors():
                self.guard.settle()

    def _check(self, tensor, what: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what} needs a torch.Tensor, got {type(tensor).__name__}")
        if what in IN_PLACE and tensor.requires_grad and torch.is_grad_enabled():  # before any byte moves
            raise TypeError(f"{what} writes its result into the tensor, which requires grad: pass tensor.detach(), "
                            f"or call it under torch.no_grad()")
        if not self.engine.supports(tensor.dtype):
            raise TypeError(f"{what}: dtype {tensor.dtype} is not supported by the {self.engine_name} engine")

    def _native_async_for(self, flat: torch.Tensor, kind: str) -> bool:
        """Whether the engine's own async ``kind`` of collective can take ``flat`` as it is (no host staging)."""
        native = getattr(self.engine, "native_async", False)
        # Only when no run_async job is queued: it would have to go first on every rank.
        return (native and self._engine_reads(flat, kind)
                and self._worker.idle() and not self._worker.on_worker_thread())

    def _can_start(self, *tensors: torch.Tensor, begins: str = "start_alltoall") -> bool:
        """Whether a collective on ``tensors`` is run with the engine's nonblocking operation (its method
        ``begins``): the engine has it and reads the tensors in place. Whether it then begins on this thread or
        behind a queued ``run_async`` job is :meth:`_begin`'s choice; which operation runs must not depend on it.
        """
        kind = begins.removeprefix("start_")
        if not hasattr(self.engine, begins) or not all(self._engine_reads(t, kind) for t in tensors):
            return False
        return all(t.is_contiguous() for t in tensors[1:])  # an ``out`` the engine must write in place

    def _begin(self, signature: Signature, nbytes: int, work, start, blocking: bool, done=None):
        """Run a collective: blocking, queued on the background thread, or begun here without waiting.

        ``work()`` runs it to the end and returns the result; ``start()`` begins
        it and returns (result, the engine's request); the handle's ``wait()``
        then waits for that request and returns ``done(result)`` (default: result).
        """
        if blocking or start is None:
            return self._run(lambda: self._guarded(signature, nbytes, work), blocking)
        if not (self._worker.on_worker_thread() or self._worker.idle()):
            # Queued behind a run_async job (it goes first on every rank), and still begun with the engine's
            # nonblocking operation: a rank whose thread was idle began it at once, and MPI never matches a
            # blocking collective with a nonblocking one (a hang, before: tests/workers/collectives.py).
            return self._run(lambda: self._begin(signature, nbytes, work, start, False, done).wait(), False)
        with self._engine_errors():
            self.guard.begin(signature, nbytes)
            result, request = start()
        finish = (lambda: self._ended(result)) if done is None else (lambda: self._ended(done(result)))
        return self._track(Handle(work=request, finish=finish, errors=self._engine_errors))

    def _track(self, handle: Handle) -> Handle:
        if not self._worker.on_worker_thread():  # the background thread's jobs wait for their own
            self._started = [h for h in self._started if h._finish is not None]
            self._started.append(handle)
        return handle

    def progress(self) -> int:
        """Let the collectives begun asynchronously on this thread move; return how many are still in flight.

        Open MPI moves a nonblocking collective only while this rank is inside
        an MPI call, so code that computes between starting collectives and
        waiting for them calls this now and then (an ``MPI_Test`` per
        collective, about a microsecond); Gloo and NCCL move on their own, and
        this only counts.

        >>> handle = comm.allreduce_async(torch.ones(2**20))   # doctest: +SKIP
        >>> comm.progress()                                     # doctest: +SKIP
        1
        """
        with self._engine_errors():
            self.guard.poll()
        self._started = [h for h in self._started if h._finish is not None and not h.is_completed()]
        return len(self._started)

    def _engine_reads(self, flat: torch.Tensor, kind: str) -> bool:
        """Whether the engine's ``kind`` of collective (a :class:`Signature`'s) takes ``flat`` where it is: NCCL
        only device memory; MPI without CUDA only host memory; Gloo a GPU tensor in allreduce and broadcast."""
        if flat.is_cuda:
            return kind in getattr(self.engine, "device_collectives", ())
        return not getattr(self.engine, "needs_device_tensors", False)

    def _to_engine(self, flat: torch.Tensor, kind: str = "allreduce") -> torch.Tensor:
        """The tensor the engine's ``kind`` of collective can read: itself, a device copy of a host tensor (NCCL),
        or a pinned host copy of a GPU tensor (MPI that is not CUDA-aware). Results go back to the caller's tensor."""
        if self._engine_reads(flat, kind):
            return flat
        if not flat.is_cuda:
            return flat.to(self.device)
        key = (flat.numel(), flat.dtype)
        host = self._pinned.get(key)
        if host is None:
            host = self._pinned[key] = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
        host.copy_(flat.view(-1))
        return host

    def _sizes(self, tensor: torch.Tensor) -> list[int]:
        """Every rank's first-dimension size (one small allgather)."""
        mine = self._to_engine(torch.tensor([tensor.shape[0]], dtype=torch.int64), "allgather")
        return self.engine.allgather(mine, [1] * self.size).tolist()

    # -- collectives ------------------------------------------------------
    def allreduce(self, tensor: torch.Tensor, op: str = "average", name: str | None = None) -> torch.Tensor:
        """Sum or average ``tensor`` over all ranks, in place; returns it.

        >>> comm.allreduce(torch.ones(3), name="ones")          # doctest: +SKIP
        tensor([1., 1., 1.])
        """
        try:  # the common case on its own short path: each step below costs 0.1-0.5 µs, and a 4 KB MPI
            # allreduce 3 µs (docs/benchmarks.md, "The blocking allreduce's own path")
            key = (tensor.dtype, tensor.shape, name, op)
            signature = self._fast_allreduce.get(key)
        except (AttributeError, TypeError):  # not a tensor (or an unhashable name): the full path says why
            signature = None
        # A job on the communication thread (run_async: PowerSGD's second allreduce) already holds the lock: the
        # full path runs it there. ``_last`` alone does not tell: submit() queues a job before it sets ``_last``, so
        # the thread could start the job, see no job queued, and wait on its own lock (a hang, seen under load).
        if (signature is None or tensor.__class__ is not torch.Tensor or tensor.is_cuda or tensor.requires_grad
                or not tensor.is_contiguous() or self._worker._last is not None or self._worker.on_worker_thread()
                or (op == "average" and tensor.dtype in DIVIDE_FIRST)):
            return self._allreduce(tensor, op, blocking=True, name=name)
        with self._lock:
            self._guarded(signature, tensor.nbytes, lambda: self.engine.allreduce_sum(tensor))
        if op == "average":
            tensor.div_(self.size)
        return tensor

    def allreduce_async(self, tensor: torch.Tensor, op: str = "average", name: str | None = None) -> Handle:
        """Start :meth:`allreduce`; ``tensor`` must not be touched until the handle is waited on."""
        return self._allreduce(tensor, op, blocking=False, name=name)

    def _allreduce(self, tensor, op, blocking, name=None):
        self._check(tensor, "allreduce")
        if op not in OPS:
            raise ValueError(f"allreduce op must be one of {OPS}, got {op!r}")
        if op == "average" and not (tensor.is_floating_point() or tensor.is_complex()):
            raise TypeError(f"average needs a floating-point tensor, got {tensor.dtype}; use op='sum'")

        signature = Signature.of("allreduce", tensor, name, op)
        if blocking and tensor.numel() and self._engine_reads(tensor, "allreduce") and len(self._fast_allreduce) < 1000:
            self._fast_allreduce[(tensor.dtype, tensor.shape, name, op)] = signature  # checked: next time, short
        if tensor.numel() == 0:
            return self._run(lambda: self._guarded(signature, 0, lambda: tensor), blocking)
        # Engines take any contiguous tensor; only a strided one needs a flat copy.
        flat = tensor if tensor.is_contiguous() else tensor.reshape(-1).clone()
        divide_first = op == "average" and tensor.dtype in DIVIDE_FIRST

        def first(buf):  # before the data moves: after the check, which may refuse the call
            return buf.div_(self.size) if divide_first else buf

        def finish(buf):
            if op == "average" and not divide_first:
                buf.div_(self.size)
            if buf is not tensor:
                tensor.copy_(buf.view(tensor.shape))
            return tensor

        def work():
            buf = self._to_engine(first(flat), "allreduce")
            self.engine.allreduce_sum(buf)
            return finish(buf)

        can_start = not blocking and self._can_start(flat, begins="start_allreduce")
        return self._begin(signature, flat.nbytes, work, (lambda: (flat, self.engine.start_allreduce(first(flat))))
                           if can_start else None, blocking, done=finish)

    def _ended(self, result):
        self.guard.end()
        return result

    def allgather(self, tensor: torch.Tensor, sizes: list[int] | None = None, name: str | None = None) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along dim 0 (first dims may differ), as Horovod does.

        ``sizes``, every rank's first dimension when the caller knows them,
        saves the small collective that otherwise finds them out.

        >>> comm.allgather(torch.tensor([comm.rank]))   # doctest: +SKIP
        tensor([0, 1])
        """
        return self._allgather(tensor, sizes, blocking=True, name=name)

    def allgather_async(self, tensor: torch.Tensor, sizes: list[int] | None = None, name: str | None = None,
                        out: torch.Tensor | None = None) -> Handle:
        """Start :meth:`allgather`; with equal ``sizes``, ``out`` (``size`` times ``tensor``'s rows) may receive it.

        >>> handle = comm.allgather_async(torch.tensor([comm.rank]), sizes=[1, 1])   # doctest: +SKIP
        >>> handle.wait()                                                             # doctest: +SKIP
        tensor([0, 1])
        """
        return self._allgather(tensor, sizes, blocking=False, name=name, out=out)

    def _allgather(self, tensor, sizes, blocking, name=None, out=None):
        self._check(tensor, "allgather")
        if tensor.dim() == 0:
            tensor = tensor.view(1)
        if sizes is not None and (len(sizes) != self.size or sizes[self.rank] != tensor.shape[0]):
            raise ValueError(f"allgather sizes {sizes} do not fit {self.size} ranks and this rank's "
                             f"{tensor.shape[0]} rows")

        def work():
            rows = list(sizes) if sizes is not None else self._sizes(tensor)
            row = math.prod(tensor.shape[1:])
            flat = self._to_engine(tensor.reshape(-1).contiguous(), "allgather")
            gathered = self.engine.allgather(flat, [r * row for r in rows])
            gathered = gathered.to(tensor.device).view(sum(rows), *tensor.shape[1:])
            return gathered if out is None else out.copy_(gathered)

        def start():
            flat = tensor.reshape(-1).contiguous()
            target = out if out is not None else flat.new_empty(self.size * flat.numel())
            return target.view(self.size * tensor.shape[0], *tensor.shape[1:]), \
                self.engine.start_allgather(flat, target.view(-1))

        equal = sizes is not None and len(set(sizes)) == 1
        signature = Signature.of("allgather", tensor, name, "" if sizes is None else f"rows {sizes}",
                                 vary_first=sizes is None)
        can_start = not blocking and equal and self._can_start(tensor, *([] if out is None else [out]),
                                                                 begins="start_allgather")
        return self._begin(signature, tensor.nbytes, work, start if can_start else None, blocking)

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", name: str | None = None) -> torch.Tensor:
        """Reduce over ranks, then give rank r the r-th piece along dim 0.

        Pieces follow ``torch.tensor_split``: with 10 rows on 4 ranks, ranks get
        3, 3, 2, 2 rows. Returns a new tensor.

        >>> comm.reduce_scatter(torch.ones(4))        # doctest: +SKIP
        tensor([2., 2.])                               # rank 0 of 2
        """
        return self._reduce_scatter(tensor, op, blocking=True, name=name)

    def reduce_scatter_async(self, tensor: torch.Tensor, op: str = "sum", name: str | None = None,
                             out: torch.Tensor | None = None) -> Handle:
        """Start :meth:`reduce_scatter`; ``out`` (this rank's piece) may receive it. With equal pieces, ``op="sum"``
        and an engine that has it, the engine's own nonblocking reduce-scatter runs (``MPI_Ireduce_scatter_block``,
        Gloo's or NCCL's ``async_op``); otherwise the background thread runs the blocking one.

        >>> handle = comm.reduce_scatter_async(torch.ones(4), out=torch.empty(2))   # doctest: +SKIP
        >>> handle.wait()                                                          # doctest: +SKIP
        tensor([2., 2.])
        """
        return self._reduce_scatter(tensor, op, blocking=False, name=name, out=out)

    def _reduce_scatter(self, tensor, op, blocking, name=None, out=None):
        self._check(tensor, "reduce_scatter")
        if op not in OPS:
            raise ValueError(f"reduce_scatter op must be one of {OPS}, got {op!r}")
        if tensor.dim() == 0:
            raise ValueError("reduce_scatter needs a tensor with at least one dimension")
        if op == "average" and not tensor.is_floating_point():
            raise TypeError(f"average needs a floating-point tensor, got {tensor.dtype}; use op='sum'")
        rows = split_sizes(tensor.shape[0], self.size)
        if out is not None and (out.numel() != rows[self.rank] * math.prod(tensor.shape[1:]) or out.dtype != tensor.dtype):
            raise ValueError(f"reduce_scatter out {tuple(out.shape)} {out.dtype} does not hold this rank's "
                             f"{rows[self.rank]} rows of {tuple(tensor.shape)} {tensor.dtype}")

        divide_first = op == "average" and tensor.dtype in DIVIDE_FIRST

        def work():
            row = math.prod(tensor.shape[1:])
            flat = tensor.reshape(-1) / self.size if divide_first else tensor.reshape(-1).contiguous()
            flat = self._to_engine(flat, "reduce_scatter")
            piece = self.engine.reduce_scatter_sum(flat, [r * row for r in rows])
            if op == "average" and not divide_first:
                piece.div_(self.size)
            piece = piece.to(tensor.device).view(rows[self.rank], *tensor.shape[1:])
            return piece if out is None else out.copy_(piece.view(out.shape))

        def start():
            flat = tensor.reshape(-1).contiguous()
            target = out if out is not None else flat.new_empty(rows[self.rank], *tensor.shape[1:])
            return target, self.engine.start_reduce_scatter(flat, target.view(-1))

        signature = Signature.of("reduce_scatter", tensor, name, op)
        can_start = (not blocking and op == "sum" and len(set(rows)) == 1 and tensor.numel() > 0
                     and self._can_start(tensor, *([] if out is None else [out]), begins="start_reduce_scatter"))
        return self._begin(signature, tensor.nbytes, work, start if can_start else None, blocking)

    def broadcast(self, tensor: torch.Tensor, root: int = 0, name: str | None = None) -> torch.Tensor:
        """Overwrite ``tensor`` on every rank with rank ``root``'s, in place; returns it.

        >>> comm.broadcast(torch.tensor([comm.rank]), root=0)   # doctest: +SKIP
        tensor([0])
        """
        return self._broadcast(tensor, root, blocking=True, name=name)

    def broadcast_async(self, tensor: torch.Tensor, root: int = 0, name: str | None = None) -> Handle:
        """Start :meth:`broadcast`."""
        return self._broadcast(tensor, root, blocking=False, name=name)

    def _broadcast(self, tensor, root, blocking, name=None):
        self._check(tensor, "broadcast")
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast root {root} is not a rank of this job (size {self.size})")

        signature = Signature.of("broadcast", tensor, name, f"from {root}")
        if tensor.numel() == 0:
            return self._run(lambda: self._guarded(signature, 0, lambda: tensor), blocking)
        flat = tensor if tensor.is_contiguous() else tensor.reshape(-1).clone()

        def finish(buf):
            if buf is not tensor:
                tensor.copy_(buf.view(tensor.shape))
            return tensor

        if not blocking and self._native_async_for(flat, "broadcast"):
            with self._engine_errors():
                self.guard.begin(signature, flat.nbytes)
                work = self.engine.broadcast(flat, root, async_op=True)
            return Handle(work=work, finish=lambda: self._ended(finish(flat)), errors=self._engine_errors)

        def work():
            buf = self._to_engine(flat, "broadcast")
            self.engine.broadcast(buf, root)
            return finish(buf)

        return self._run(lambda: self._guarded(signature, flat.nbytes, work), blocking)

    def alltoall(self, tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
        """Send the r-th of ``size`` equal pieces (along dim 0) to rank r; return the pieces received, in rank order.

        >>> comm.alltoall(torch.tensor([10 * comm.rank, 10 * comm.rank + 1]))   # doctest: +SKIP
        tensor([0, 10])                                                        # rank 0 of 2
        """
        return self._alltoall(tensor, None, blocking=True, name=name)

    def alltoall_async(self, tensor: torch.Tensor, out: torch.Tensor | None = None,
                       name: str | None = None) -> Handle:
        """Start :meth:`alltoall`; ``out`` (shaped like ``tensor``) may receive it.

        A ``run_async`` job that starts several and works between them overlaps
        its arithmetic with the transfers (the compressed averaging does).

        >>> handle = comm.alltoall_async(torch.tensor([10 * comm.rank, 10 * comm.rank + 1]))   # doctest: +SKIP
        >>> handle.wait()                                                                     # doctest: +SKIP
        tensor([0, 10])
        """
        return self._alltoall(tensor, out, blocking=False, name=name)

    def _alltoall(self, tensor, out, blocking, name=None):
        self._check(tensor, "alltoall")
        if tensor.dim() == 0 or tensor.shape[0] % self.size:
            raise ValueError(f"alltoall needs a first dimension divisible by {self.size} ranks, got {tuple(tensor.shape)}")
        if out is not None and (out.shape != tensor.shape or out.dtype != tensor.dtype):
            raise ValueError(f"alltoall out {tuple(out.shape)} {out.dtype} differs from the tensor's "
                             f"{tuple(tensor.shape)} {tensor.dtype}")

        def work():
            if tensor.numel() == 0:
                return tensor.clone() if out is None else out
            flat = self._to_engine(tensor.reshape(-1).contiguous(), "alltoall")
            received = self.engine.alltoall(flat).to(tensor.device).view(tensor.shape)
            return received if out is None else out.copy_(received)

        def start():
            flat = tensor.reshape(-1).contiguous()
            target = out if out is not None else torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
            return target, self.engine.start_alltoall(flat, target.view(-1))

        signature = Signature.of("alltoall", tensor, name)
        can_start = (not blocking and tensor.numel() > 0
                     and self._can_start(tensor, *([] if out is None else [out])))
        return self._begin(signature, tensor.nbytes, work, start if can_start else None, blocking)

    def barrier(self) -> None:
        """Wait until every rank has reached this point."""
        signature = Signature("barrier", None, "-", ())
        self._run(lambda: self._guarded(signature, 0, self.engine.barrier), blocking=True)

    def prepare_allreduce(self, tensor: torch.Tensor, name: str | None = None) -> Prepared | None:
        """A sum-allreduce of ``tensor`` in place, made ready once to be begun at every step by :meth:`start_prepared`.

        What :meth:`allreduce_async` works out at each call is worked out here
        once: the arguments checked, the signature and byte count computed, the
        engine's nonblocking call looked up. None where the engine would not begin
        it with that call (an empty or strided tensor, one it must stage): use
        :meth:`allreduce_async` then.

        >>> bucket = comm.prepare_allreduce(flat, name="bucket 0")    # once   # doctest: +SKIP
        >>> comm.start_prepared(bucket).wait()                         # at every step   # doctest: +SKIP
        tensor([...])
        """
        self._check(tensor, "allreduce")
        if not (tensor.numel() and tensor.is_contiguous() and self._can_start(tensor, begins="start_allreduce")):
            return None
        return Prepared(tensor, Signature.of("allreduce", tensor, name, "sum"), tensor.nbytes,
                        allreduce_starter(self.engine, tensor))

    def start_prepared(self, prepared: Prepared) -> Handle:
        """Begin a :meth:`prepare_allreduce`'d allreduce, as ``allreduce_async(tensor, op="sum", name=name)`` would:
        checked against the other ranks' collectives by the guard and recorded for the failure watch as every
        collective is, queued behind a pending :meth:`run_async` job as any would be.

        >>> handle = comm.start_prepared(bucket); handle.wait()       # doctest: +SKIP
        tensor([...])
        """
        if not (self._worker.on_worker_thread() or self._worker.idle()):
            return self._allreduce(prepared.tensor, "sum", blocking=False, name=prepared.signature.name)
        try:  # (_begin's `with self._engine_errors()`, written out: a plain try costs nothing)
            self.guard.begin(prepared.signature, prepared.nbytes)
            request = prepared.start()
        except CollectiveMismatchError:
            raise
        except RuntimeError as error:
            raise self._failed(error) from error
        finish = functools.partial(self._ended, prepared.tensor)
        return self._track(Handle(work=request, finish=finish, errors=self._engine_errors))

    def allgather_bytes(self, data: bytes, name: str | None = None) -> list[bytes]:
        """Every rank's ``data``, in rank order; for small metadata such as model signatures.

        >>> comm.allgather_bytes(b"hello")            # doctest: +SKIP
        [b'hello', b'hello']
        """
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        gathered = self.allgather(payload, name=name)
        lengths = self.allgather(torch.tensor([len(data)], dtype=torch.int64), name=name and f"{name} length").tolist()
        out, start = [], 0
        for n in lengths:
            out.append(gathered[start: start + n].numpy().tobytes())
            start += n
        return out

    def shutdown(self) -> None:
        """Finish queued collectives, tell the watch this rank finished, and release the engine."""
        with contextlib.suppress(CollectiveMismatchError, RuntimeError):
            self._settle_posted()  # a check begun for collectives that never came: every rank posted it
        self._worker.drain()
        self._worker.stop()
        if self.watch is not None:
            self.watch.stop(wait_for_others=self.watch.settings.failure_timeout or 10.0)
            self.watch = None
        self.engine.shutdown()


class Prepared(NamedTuple):
    """A sum-allreduce of one tensor in place, ready to begin (:meth:`Communicator.prepare_allreduce`).

    >>> Prepared(torch.zeros(4), Signature("allreduce", "b", "float32", (4,), "sum"), 16, print).nbytes
    16
    """

    tensor: torch.Tensor
    signature: Signature
    nbytes: int
    start: Callable  # begins it on the engine; returns the engine's request


def allreduce_starter(engine, tensor: torch.Tensor) -> Callable:
    """``engine.start_allreduce(tensor)`` as a call with nothing left to work out.

    Over torch.distributed on a host tensor, that is the process group's own
    ``allreduce``, as DDP's reducer calls it: ``dist.all_reduce``'s Python
    around it (its checks, the options built anew) cost 16 µs a call on this
    project's 2-core machine, a third of the call (docs/benchmarks.md).

    >>> class Engine:
    ...     def start_allreduce(self, tensor): return f"started {tensor.numel()}"
    >>> allreduce_starter(Engine(), torch.zeros(3))()
    'started 3'
    """
    start = engine.start_allreduce
    if (getattr(engine, "name", None) == "torch" and not tensor.is_cuda
            and getattr(start, "__func__", None) is _torch_start_allreduce()):
        import torch.distributed as dist

        options = dist.AllreduceOptions()
        options.reduceOp, options.asyncOp = dist.ReduceOp.SUM, True
        return functools.partial(dist.group.WORLD.allreduce, [tensor], options)
    return functools.partial(start, tensor)


def _torch_start_allreduce():
    """TorchEngine's ``start_allreduce`` (``dist.all_reduce(tensor, async_op=True)`` on the default group)."""
    from gpurig.comm.torch_engine import TorchEngine

    return TorchEngine.start_allreduce


def engine_message(error: BaseException) -> str:
    """The part of an engine's error message a person needs: its first sentence, without source locations.

    >>> engine_message(RuntimeError("[/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:1921: Connection "
    ...                             "reset by peer. This is typically caused by a remote worker hanging."))
    'Read error [127.0.0.1]:1921: Connection reset by peer'
    """
    text = (str(error).strip().strip("'\"").splitlines() or [repr(error)])[0]
    text = re.sub(r"^\[[^\]]*:\d+\]\s*", "", text)
    return re.split(r"\.\s", text, maxsplit=1)[0].rstrip(".")


def split_sizes(n: int, parts: int) -> list[int]:
    """How ``n`` items split over ``parts`` ranks, as ``torch.tensor_split`` does.

    >>> split_sizes(10, 4)
    [3, 3, 2, 2]
    """
    base, extra = divmod(n, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]
