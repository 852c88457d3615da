"""Time to move bytes: over PCIe, from a disk, over a network; and a link shared by several senders.

One model for all of them: ``seconds = latency + bytes / (rate × efficiency)``
(the alpha-beta, or Hockney, model; alpha = latency, beta = 1 / rate).
"""

from __future__ import annotations

from gpurig.units import DECIMAL, bytes_per_second

# What a copy from ordinary (pageable) host memory reaches against the link's theoretical
# rate: the source's "in practice you often see PCIe be twice as slow". `gpurig bench`
# measures the real factor on a GPU machine; this is the stand-in when nothing is measured.
PAGEABLE_EFFICIENCY = 0.5
PINNED_EFFICIENCY = 1.0


def transfer_seconds(nbytes: float, rate_bytes_per_s: float, latency_s: float = 0.0, efficiency: float = 1.0) -> float:
    """Seconds to move ``nbytes`` over a link of ``rate_bytes_per_s`` reaching ``efficiency`` of it.

    >>> transfer_seconds(4_000_000, 5e9)       # 4 MB at 40 Gbit/s (SI)
    0.0008
    >>> transfer_seconds(1e9, 1e9, latency_s=0.5, efficiency=0.5)
    2.5
    """
    if rate_bytes_per_s <= 0 or not 0 < efficiency <= 1:
        raise ValueError(f"rate must be positive and efficiency in (0, 1], got {rate_bytes_per_s}, {efficiency}")
    return latency_s + nbytes / (rate_bytes_per_s * efficiency)


def host_copy_efficiency(pinned: bool) -> float:
    """The fraction of PCIe's theoretical rate a host-to-GPU copy reaches: pinned or pageable memory.

    >>> host_copy_efficiency(True), host_copy_efficiency(False)
    (1.0, 0.5)
    """
    return PINNED_EFFICIENCY if pinned else PAGEABLE_EFFICIENCY


def pcie_lane_bytes_per_s(giga_transfers_per_s: float, encoding: float) -> float:
    """Bytes per second one PCIe lane carries in each direction: transfer rate × encoding efficiency / 8.

    >>> round(pcie_lane_bytes_per_s(8, 128 / 130) / 1e9, 4)     # PCIe 3.0
    0.9846
    """
    return giga_transfers_per_s * 1e9 * encoding / 8


def pcie_bytes_per_s(generation: str | float, lanes: int) -> float:
    """Theoretical bytes per second of a PCIe link, each direction, from the catalog's generation table.

    >>> round(pcie_bytes_per_s("3.0", 16) / 1e9, 2)             # the source's "15.75 GB/s"
    15.75
    """
    from gpurig.spec.catalog import pcie_generation

    gen = pcie_generation(generation)
    return lanes * pcie_lane_bytes_per_s(gen.gigatransfers_per_s, gen.encoding)


def slower_link(generations, widths) -> tuple[str, int]:
    """The PCIe generation and lanes a link runs at: the lowest of those its ends give (a PCIe 3.0 card in a 5.0
    slot runs at 3.0, an x8 card in an x16 slot at x8), ``None`` where an end does not say; 3.0 x16 where none does.

    >>> slower_link(("5.0", "3.0"), (16, None)), slower_link((None,), ())
    (('3.0', 16), ('3.0', 16))
    """
    gens = [g for g in generations if g]
    lanes = [w for w in widths if w]
    return (min(gens, key=float) if gens else "3.0"), (min(lanes) if lanes else 16)


def pcie_gbytes_per_s(generation: str | float, lanes: int) -> float:
    """The same rate in GB/s (10^9 bytes), the unit PCI-SIG and the source write it in.

    >>> round(pcie_gbytes_per_s(3, 8), 3)
    7.877
    """
    return pcie_bytes_per_s(generation, lanes) / 1e9


def quoted_rate_bytes_per_s(value: float, unit: str, base: int = DECIMAL) -> float:
    """A rate as a document quotes it ("15.75 GB/s"), read with the stated meaning of its prefix.

    The source computes its PCIe examples by reading "15.75 GB/s" as 15.75 × 2^30 bytes/s:

    >>> quoted_rate_bytes_per_s(15.75, "GB/s", base=1024) / 2**30
    15.75
    """
    return bytes_per_second(value, unit, base)


def shared_rate(rate_bytes_per_s: float, sharers: int) -> float:
    """Each sender's share of a link that ``sharers`` use at once (equal shares).

    The source's InfiniBand example: 8 GB/s to the other 5 GPUs of 6 gives each 1.6 GB/s.

    >>> shared_rate(8.0, 6 - 1)
    1.6
    """
    if sharers < 1:
        raise ValueError(f"a link needs at least one sender, got {sharers}")
    return rate_bytes_per_s / sharers
