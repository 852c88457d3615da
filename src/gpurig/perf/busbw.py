"""nccl-tests' algorithm bandwidth and bus bandwidth of a collective.

algbw = bytes / time, where bytes is the size of the buffer each rank holds
(for allgather: the full output). busbw = algbw × a factor per collective that
makes it the rate each link carries in an optimal ring, so it can be held
against the hardware's link bandwidth whatever the rank count (nccl-tests,
doc/PERFORMANCE.md):

=============== ==========
allreduce       2(n−1)/n
reduce_scatter  (n−1)/n
allgather       (n−1)/n
broadcast       1
reduce          1
sendrecv        1
alltoall        (n−1)/n
=============== ==========
"""

from __future__ import annotations

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "sendrecv", "alltoall")


def bus_factor(collective: str, ranks: int) -> float:
    """busbw / algbw for ``collective`` on ``ranks`` ranks.

    >>> bus_factor("allreduce", 2), bus_factor("allreduce", 8), bus_factor("allgather", 4), bus_factor("broadcast", 4)
    (1.0, 1.75, 0.75, 1.0)
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: one of {', '.join(COLLECTIVES)}")
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    n = ranks
    if collective == "allreduce":
        return 2 * (n - 1) / n
    if collective in ("reduce_scatter", "allgather", "alltoall"):
        return (n - 1) / n
    return 1.0


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes per second: the buffer's bytes over the time.

    >>> algbw(4e6, 0.002)
    2000000000.0
    """
    return nbytes / seconds


def busbw(collective: str, nbytes: float, seconds: float, ranks: int) -> float:
    """Bus bandwidth in bytes per second, as nccl-tests reports it.

    >>> busbw("allreduce", 4e6, 0.002, ranks=4)
    3000000000.0
    """
    return algbw(nbytes, seconds) * bus_factor(collective, ranks)
