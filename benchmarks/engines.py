"""Both engines in one job, so a benchmark compares them side by side under the same noise.

Run inside ``gpurig run --engine mpi``: MPI comes up first, then rank 0 picks a
port and the ranks form a Gloo process group (torch.distributed's default group,
which DDP uses) through it.
"""

import atexit
import os
import socket
import statistics
import time

import torch

import gpurig
from gpurig.comm import Communicator
from gpurig.comm.torch_engine import TorchEngine


def both_engines() -> tuple[Communicator, Communicator]:
    """(MPI communicator, Gloo communicator) over the same ranks.

    >>> mpi, gloo = both_engines()          # doctest: +SKIP
    """
    mpi = gpurig.init("mpi")
    port = 0
    if mpi.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = int(mpi.broadcast(torch.tensor([port]), root=0).item())
    os.environ.update(RANK=str(mpi.rank), WORLD_SIZE=str(mpi.size), LOCAL_RANK=str(mpi.local_rank),
                      LOCAL_WORLD_SIZE=str(mpi.local_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gloo = Communicator(TorchEngine(backend="gloo"))
    atexit.register(gloo.shutdown)  # before MPI's own shutdown (atexit runs last-in, first-out)
    return mpi, gloo


def timed(fn, repeats: int) -> list[float]:
    """Seconds per call of ``fn``, ``repeats`` times."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def median(values) -> float:
    return statistics.median(values)
