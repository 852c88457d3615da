"""The MPI engine: collectives through mpi4py's buffer interface, as the source recommends.

Tensors travel as raw buffers (never pickled). float16 and bfloat16 have no MPI
datatype, so they travel as 16-bit integers and are summed by an MPI user
operation that reinterprets them. GPU tensors are handed to MPI directly when the
library is CUDA-aware; otherwise the Communicator stages them through host memory.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

import mpi4py

from gpurig.comm.signature import COLLECTIVES
from gpurig.launch.mpirun import mpi_settings

# All MPI calls are serialised by the Communicator's lock, but they may come from
# its worker thread, not the thread that initialised MPI.
mpi4py.rc.thread_level = "multiple"
for _name, _value in mpi_settings(os.environ).items():  # read when MPI starts, below: a plain mpirun's ranks and a
    os.environ.setdefault(_name, _value)                    # singleton get them too
from mpi4py import MPI  # noqa: E402

_NATIVE = {
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.int8: MPI.INT8_T,
    torch.uint8: MPI.UINT8_T,
    torch.int16: MPI.INT16_T,
    torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T,
    torch.bool: MPI.C_BOOL,
}
_HALF = (torch.float16, torch.bfloat16)
# The most one nonblocking allreduce carries: Open MPI's Iallreduce (libnbc) allocates a buffer as large as its
# message, so a 64 MB bucket cost 0.9 extra gradient copies; in 8 MB pieces, one in flight at a time, 0.1
# (docs/benchmarks.md, "Peak memory per rank"). 4 MB pieces saved 0.05 copies more but cut the MLP's 5.8 MB bucket
# in two, whose second piece waits for the last bucket's blocking allreduce (3 % slower behind 1 Gbit/s). The
# blocking Allreduce (half its message) stays one call: in pieces, each one more rendezvous, it lost 2-4x at
# 16-64 MB on a loaded machine.
ALLREDUCE_PIECE_BYTES = 8 * 2**20
# The most elements one blocking call carries: MPI counts are C ints (2**31 - 1), and Open MPI refuses a larger
# count (MPI_ERR_ARG) where its big-count calls are missing; a model of 2 GB of parameters and buffers, broadcast
# as one uint8 buffer when DataParallel starts, is past it. Larger tensors go in pieces of this many.
MAX_COUNT = 2**30


# How a nonblocking collective is waited for: MPI_Test for up to WAIT_SPIN_S, then MPI_Test between naps of
# WAIT_NAP_S. MPI_Wait busy-polls Open MPI's shared memory; on cores shared with other jobs the waiting rank then
# holds a core its late peer needs (docs/benchmarks.md, issue 23's third pass).
WAIT_SPIN_S = 50e-6
WAIT_NAP_S = 50e-6


def wait_politely(request, spin_s: float | None = WAIT_SPIN_S, nap_s: float = WAIT_NAP_S) -> None:
    """Wait for an mpi4py ``request``: test it, busy for ``spin_s`` at most, then between naps of ``nap_s``
    (``spin_s=None``: ``MPI_Wait``).

    >>> wait_politely(MPI.REQUEST_NULL)
    """
    if spin_s is None:
        request.Wait()
        return
    give_up = time.perf_counter() + spin_s
    while not request.Test():
        if time.perf_counter() > give_up:
            time.sleep(nap_s)


def _half_sum(dtype):
    def add(inbuf, inoutbuf, datatype):
        if not len(memoryview(inoutbuf)):
            return
        acc = torch.frombuffer(inoutbuf, dtype=dtype)
        acc.add_(torch.frombuffer(inbuf, dtype=dtype))

    return MPI.Op.Create(add, commute=True)


def mpi_is_cuda_aware() -> bool:
    """Whether the loaded MPI library can read and write GPU memory.

    Asks Open MPI's ``MPIX_Query_cuda_support``; ``GPURIG_MPI_CUDA_AWARE=0/1``
    overrides the answer (for MPI libraries that cannot be asked).

    >>> isinstance(mpi_is_cuda_aware(), bool)
    True
    """
    forced = os.environ.get("GPURIG_MPI_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        libmpi = ctypes.CDLL(None)
        query = getattr(libmpi, "MPIX_Query_cuda_support", None)
        if query is None:
            with open("/proc/self/maps") as maps:
                found = next((line.split()[-1] for line in maps if "libmpi.so" in line), None)
            if found is not None:
                query = getattr(ctypes.CDLL(found), "MPIX_Query_cuda_support", None)
        return bool(query()) if query is not None else False
    except OSError:
        return False


def _abort_on_unhandled_exception() -> None:
    """Make an uncaught exception end the whole MPI job instead of hanging in MPI_Finalize."""
    from mpi4py.run import set_abort_status

    previous = sys.excepthook
    if getattr(previous, "_gpurig", False):
        return

    def hook(kind, value, traceback):
        set_abort_status(1)
        previous(kind, value, traceback)

    hook._gpurig = True
    sys.excepthook = hook


class Request:
    """A non-blocking MPI operation, with torch's ``Work`` interface (``wait``, ``is_completed``).

    It holds the buffers until the operation ends. Open MPI moves the data only
    inside MPI calls, so ``is_completed()`` (MPI_Test) also drives it forward.
    """

    def __init__(self, request, *buffers, spin_s: float | None = WAIT_SPIN_S):
        self._request, self._buffers, self._spin_s = request, buffers, spin_s

    def wait(self) -> None:
        wait_politely(self._request, self._spin_s)
        self._buffers = ()

    def is_completed(self) -> bool:
        return self._request.Test()


class ChainedRequest:
    """Non-blocking allreduces of a tensor's pieces, one in flight at a time, with :class:`Request`'s interface:
    each piece is begun when the one before has ended (at a ``wait()`` or an ``is_completed()``), so MPI never
    holds more than one piece's temporary buffer.
    """

    def __init__(self, begin, pieces: list[torch.Tensor], tensor: torch.Tensor, spin_s: float | None = WAIT_SPIN_S):
        self._begin, self._pieces, self._tensor, self._spin_s = begin, list(pieces), tensor, spin_s
        self._request = begin(self._pieces.pop(0))

    def wait(self) -> None:
        while self._request is not None:
            wait_politely(self._request, self._spin_s)
            self._next()
        self._tensor = None

    def is_completed(self) -> bool:
        while self._request is not None and self._request.Test():
            self._next()
        return self._request is None

    def _next(self) -> None:
        self._request = self._begin(self._pieces.pop(0)) if self._pieces else None


def allreduce_pieces(tensor: torch.Tensor, piece_bytes: int | None = None) -> list[torch.Tensor]:
    """``tensor`` (contiguous) cut into flat views of at most ``piece_bytes`` (default
    :data:`ALLREDUCE_PIECE_BYTES`) each, for one nonblocking allreduce apiece.

    >>> [p.numel() for p in allreduce_pieces(torch.zeros(10), piece_bytes=16)]
    [4, 4, 2]
    """
    per = max(1, (piece_bytes or ALLREDUCE_PIECE_BYTES) // tensor.element_size())
    return list(tensor.reshape(-1).split(per)) if tensor.numel() > per else [tensor]


class MPIEngine:
    """Blocking collectives on flat, contiguous tensors over ``MPI.COMM_WORLD``.

    >>> engine = MPIEngine()            # one rank when started without mpirun
    >>> engine.size >= 1
    True
    """

    name = "mpi"
    wait_spin_s: float | None = WAIT_SPIN_S  # how its requests are waited for (wait_politely; None: MPI_Wait)

    def __init__(self, comm=None):
        self.comm = comm or MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank = node.Get_rank()
        self.local_size = node.Get_size()
        node.Free()
        self.device_collectives = COLLECTIVES if mpi_is_cuda_aware() else frozenset()
        self._half_ops = {dtype: _half_sum(dtype) for dtype in _HALF}
        if self.size > 1:
            _abort_on_unhandled_exception()

    def supports(self, dtype: torch.dtype) -> bool:
        return dtype in _NATIVE or dtype in _HALF

    def _buf(self, tensor: torch.Tensor, counts=None):
        if tensor.dtype in _HALF:
            tensor, datatype = tensor.view(torch.int16), MPI.INT16_T
        else:
            datatype = _NATIVE[tensor.dtype]
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()
            data = tensor
        else:
            data = tensor.numpy()
        if counts is None:
            return [data, datatype]
        displs = [sum(counts[:i]) for i in range(len(counts))]
        return [data, (list(counts), displs), datatype]

    def _whole(self, tensor: torch.Tensor):
        """:meth:`_buf` for a collective whose count is the whole buffer (allreduce, broadcast): a host tensor
        by its address, 0.3 µs instead of a numpy view's 1.1 µs a call (docs/benchmarks.md). The address does
        not keep the tensor alive; the caller does (a :class:`Request` holds its tensors)."""
        if tensor.is_cuda or not tensor.numel():
            return self._buf(tensor)
        datatype = MPI.INT16_T if tensor.dtype in _HALF else _NATIVE[tensor.dtype]
        return [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), tensor.numel(), datatype]

    def _sum_op(self, dtype):
        # MPI sums no C bool (MPI_ERR_OP); a sum of booleans is their logical or, as torch.distributed gives it
        return MPI.LOR if dtype == torch.bool else self._half_ops.get(dtype, MPI.SUM)

    def allreduce_sum(self, tensor: torch.Tensor) -> None:
        if tensor.numel() <= MAX_COUNT:
            self.comm.Allreduce(MPI.IN_PLACE, self._whole(tensor), op=self._sum_op(tensor.dtype))
            return
        for piece in tensor.reshape(-1).split(MAX_COUNT):
            self.comm.Allreduce(MPI.IN_PLACE, self._whole(piece), op=self._sum_op(tensor.dtype))

    def allgather(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        out = tensor.new_empty(sum(counts))
        if len(set(counts)) == 1:  # Open MPI's Allgather has faster algorithms than its Allgatherv
            self.comm.Allgather(self._buf(tensor), self._buf(out))
        else:
            self.comm.Allgatherv(self._buf(tensor), self._buf(out, counts))
        return out

    def reduce_scatter_sum(self, tensor: torch.Tensor, counts: list[int]) -> torch.Tensor:
        out = tensor.new_empty(counts[self.rank])
        self.comm.Reduce_scatter(self._buf(tensor), self._buf(out), list(counts), op=self._sum_op(tensor.dtype))
        return out

    def alltoall(self, tensor: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(tensor)
        self.comm.Alltoall(self._buf(tensor), self._buf(out))
        return out

    def start_allreduce(self, tensor: torch.Tensor) -> "Request":
        """Begin :meth:`allreduce_sum` in place without waiting; MPI moves it whenever this rank calls MPI."""
        op, pieces = self._sum_op(tensor.dtype), allreduce_pieces(tensor)
        if len(pieces) > 1:
            return ChainedRequest(lambda piece: self.comm.Iallreduce(MPI.IN_PLACE, self._whole(piece), op=op),
                                  pieces, tensor, spin_s=self.wait_spin_s)
        return Request(self.comm.Iallreduce(MPI.IN_PLACE, self._whole(tensor), op=op), tensor, spin_s=self.wait_spin_s)

    def start_alltoall(self, tensor: torch.Tensor, out: torch.Tensor) -> "Request":
        """Begin :meth:`alltoall` into ``out`` without waiting; MPI moves it whenever this rank calls MPI."""
        return Request(self.comm.Ialltoall(self._buf(tensor), self._buf(out)), tensor, out, spin_s=self.wait_spin_s)

    def start_reduce_scatter(self, tensor: torch.Tensor, out: torch.Tensor) -> "Request":
        """Begin a reduce-scatter (sum) of equal pieces into ``out`` (this rank's piece) without waiting."""
        return Request(self.comm.Ireduce_scatter_block(self._buf(tensor), self._buf(out), op=self._sum_op(tensor.dtype)),
                       tensor, out, spin_s=self.wait_spin_s)

    def start_allgather(self, tensor: torch.Tensor, out: torch.Tensor) -> "Request":
        """Begin an allgather of equal pieces into ``out`` without waiting."""
        return Request(self.comm.Iallgather(self._buf(tensor), self._buf(out)), tensor, out, spin_s=self.wait_spin_s)

    def poke(self) -> None:
        """Let Open MPI move this rank's nonblocking collectives (it does only inside MPI calls): a probe, about
        a microsecond, for a rank that waits outside MPI (the check board)."""
        self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)

    def broadcast(self, tensor: torch.Tensor, root: int) -> None:
        for piece in (tensor,) if tensor.numel() <= MAX_COUNT else tensor.reshape(-1).split(MAX_COUNT):
            self.comm.Bcast(self._whole(piece), root=root)

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int) -> None:
        """End the whole job now (from any thread; a blocked MPI call cannot be interrupted otherwise)."""
        self.comm.Abort(code)

    def shutdown(self) -> None:
        for op in self._half_ops.values():
            op.Free()
        self._half_ops = {}
