"""What compressing one bucket of gradients costs the device: the codec's own arithmetic.

Element-wise codecs (fp16, int8, …) cost a fixed time per value, measured by
``gpurig bench`` (or estimated from memory passes on a catalog GPU): in the
compressed reduce-scatter + allgather each rank encodes, with error feedback,
every value once (what it sends and the average it owns) and decodes
(P−1)/P of them plus the whole gathered average. PowerSGD's cost is its
matrix products — P = M·Q, Q = Mᵀ·P̂, the residual M − P̂·Qᵀ and the average
P̂·Qᵀ, each an (n × m × rank) GEMM — plus one pass adding the residual back.
"""

from __future__ import annotations

from gpurig.perf.compute import DTYPE_BYTES, GemmModel, memory_seconds


def elementwise_seconds(values: int, encode_s_per_value: float, decode_s_per_value: float, ranks: int) -> float:
    """Seconds of codec work one rank does to average ``values`` compressed over ``ranks``.

    >>> round(elementwise_seconds(1_000_000, 2e-9, 1e-9, ranks=2), 6)
    0.0035
    """
    return values * (encode_s_per_value + (2 - 1 / ranks) * decode_s_per_value)


def powersgd_seconds(matrices: list[tuple[int, int, int]], rank: int, gemm: GemmModel,
                     memory_bytes_per_s: float) -> float:
    """Seconds of PowerSGD arithmetic for a bucket's compressed ``matrices`` (offset, n, m) at ``rank``.

    Which of a bucket's tensors are compressed, and as which n × m matrix, is
    PowerSGD's own rule (:func:`gpurig.parallel.powersgd.split`): the caller asks it.

    >>> g = GemmModel(0, 1e10, 1e12)
    >>> round(powersgd_seconds([(0, 1000, 1000)], 4, g, 1e10) * 1000, 3)    # 4 GEMMs of 8 MFLOP + a 12 MB pass
    4.4
    """
    seconds = 0.0
    for _, n, m in matrices:
        seconds += gemm.seconds(n, rank, m) + gemm.seconds(m, rank, n) + 2 * gemm.seconds(n, m, rank)
        seconds += memory_seconds(3 * n * m * DTYPE_BYTES, memory_bytes_per_s)
    return seconds
