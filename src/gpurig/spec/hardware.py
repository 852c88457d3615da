"""What the catalog holds: GPUs, PCIe generations, GPU-to-GPU links and networks, one dataclass each.

Units are in the field names (``_gb``, ``_gbs`` = GB/s, ``_w``, ``_tflops``) and
declared with their valid range, which both the catalog's data files and
cluster specs are checked against (:mod:`gpurig.spec.fields`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gpurig.spec.fields import SpecError, number, text

SEGMENTS = ("consumer", "workstation", "datacenter")
FORM_FACTORS = ("pcie", "sxm", "oam")
COOLERS = ("blower", "open", "passive", "water")
PCIE_GENERATIONS = ("1.0", "2.0", "3.0", "4.0", "5.0", "6.0")
CONNECTOR_KINDS = ("6", "8", "12", "16", "8cpu")
CATALOG_REQUIRED = ("vendor", "architecture", "year", "segment", "form_factor", "memory_bandwidth_gbs", "fp32_tflops",
                    "tdp_w", "pcie_gen", "pcie_lanes", "cooler")


@dataclass(frozen=True)
class GPU:
    """One GPU model as its vendor specifies it (peak numbers at the boost clock).

    ``tensor_tflops`` is dense FP16/BF16 matrix throughput with FP32 accumulation
    (what mixed-precision training uses; GeForce cards run it at half their
    FP16-accumulate rate), without sparsity; ``tf32_tflops``, ``bf16_tflops`` and
    ``fp8_tflops`` are the same for TF32, BF16 and FP8 inputs (empty: the GPU has
    no tensor cores for that type). ``gpu_link_gbs`` is the GPU's total
    NVLink / Infinity Fabric bandwidth, both directions. ``compute_units`` is the
    number of streaming multiprocessors (NVIDIA SMs) or compute units (AMD CUs),
    summed over all dies of a multi-die part (K80, MI250X, MI300X); a GEMM's
    tiles are spread over them in waves. ``cache_mb`` is the last on-chip cache in
    front of memory: L2, or AMD's Infinity Cache where a part has one. ``power_connectors`` is
    ``1x6+1x8``, ``2x8``, ``1x12``, ``1x16`` (12VHPWR / 12V-2x6), ``1x8cpu``
    (EPS-12V), ``none`` (slot power only) or ``board`` (SXM/OAM module).

    Only name, memory and source are needed to describe a GPU the catalog lacks
    (``gpurig doctor`` writes what NVML reports); every catalog row has
    :data:`CATALOG_REQUIRED` too.
    """

    name: str = text()
    memory_gb: float = number("GB", 0.5, 1024)
    source: str = text()
    vendor: str | None = text(choices=("NVIDIA", "AMD"), default=None)
    architecture: str | None = text(default=None)
    year: int | None = number("year", 2008, 2030, integer=True, default=None)
    segment: str | None = text(choices=SEGMENTS, default=None)
    form_factor: str | None = text(choices=FORM_FACTORS, default=None)
    memory_bandwidth_gbs: float | None = number("GB/s", 50, 50000, default=None)
    fp32_tflops: float | None = number("TFLOPS", 0.1, 1000, default=None)
    tdp_w: float | None = number("W", 10, 3000, default=None)
    pcie_gen: str | None = text(choices=PCIE_GENERATIONS, default=None)
    pcie_lanes: int | None = number("lanes", 1, 16, integer=True, default=None)
    fp16_tflops: float | None = number("TFLOPS", 0.01, 5000, default=None)
    tensor_tflops: float | None = number("TFLOPS", 1, 20000, default=None)
    tf32_tflops: float | None = number("TFLOPS", 1, 20000, default=None)
    bf16_tflops: float | None = number("TFLOPS", 1, 20000, default=None)
    fp8_tflops: float | None = number("TFLOPS", 1, 40000, default=None)
    compute_units: int | None = number("SMs/CUs", 1, 1024, integer=True, default=None)
    cache_mb: float | None = number("MB", 0.1, 1024, default=None)
    gpu_link: str | None = text(default=None)
    gpu_link_gbs: float | None = number("GB/s", 1, 10000, default=None)
    slot_width: int | None = number("slots", 1, 4, integer=True, default=None)
    power_connectors: str | None = text(default=None)
    cooler: str | None = text(choices=COOLERS, default=None)
    aliases: str | None = text(default=None)

    def __post_init__(self):
        if self.power_connectors is not None:
            connector_counts(self.power_connectors, self.name)


# Boards that hold two GPUs which CUDA or ROCm list as two devices (a process trains on one of them): the catalog
# rows are the board's, as sold and powered; a training rank gets half of each. Tesla K80: two GK210 (NVIDIA
# datasheet); Instinct MI250 / MI250X: two GCDs (AMD CDNA 2 white paper). MI300X's chiplets are one device.
DEVICES_PER_BOARD = {"Tesla K80": 2, "Instinct MI250": 2, "Instinct MI250X": 2}
_SPLIT = ("memory_gb", "memory_bandwidth_gbs", "fp32_tflops", "fp16_tflops", "tensor_tflops", "tf32_tflops",
          "bf16_tflops", "fp8_tflops", "cache_mb", "tdp_w")


def one_device(gpu: GPU) -> GPU:
    """What one training rank of ``gpu`` gets: the board itself, or its share where the board is several devices
    (:data:`DEVICES_PER_BOARD`), its host link shared too.

    >>> from gpurig.spec import catalog
    >>> k80 = one_device(catalog.gpu("K80")); k80.memory_gb, k80.compute_units, k80.pcie_lanes
    (12.0, 13, 8)
    """
    n = DEVICES_PER_BOARD.get(gpu.name, 1)
    if n == 1:
        return gpu
    halves = {f: getattr(gpu, f) / n for f in _SPLIT if getattr(gpu, f) is not None}
    return replace(gpu, **halves, compute_units=gpu.compute_units // n if gpu.compute_units else None,
                   pcie_lanes=max(1, gpu.pcie_lanes // n) if gpu.pcie_lanes else None)


def connector_counts(connectors: str, gpu: str = "GPU") -> dict[str, int]:
    """The PCIe power connectors a card needs, by kind.

    >>> connector_counts("1x6+1x8"), connector_counts("board")
    ({'6': 1, '8': 1}, {})
    """
    if connectors in ("none", "board"):
        return {}
    counts: dict[str, int] = {}
    for part in connectors.split("+"):
        match = re.fullmatch(r"(\d+)x(6|8|12|16|8cpu)", part.strip())
        if not match:
            raise SpecError(f"{gpu}: power_connectors: {connectors!r} is not like '2x8', '1x6+1x8', '1x16', "
                            "'1x8cpu', 'none' or 'board'")
        counts[match[2]] = counts.get(match[2], 0) + int(match[1])
    return counts


@dataclass(frozen=True)
class PCIeGeneration:
    """One PCIe generation: transfer rate per lane and line-code efficiency.

    >>> PCIeGeneration("3.0", 2010, 8, "128b/130b", "PCI-SIG").encoding
    0.9846153846153847
    """

    generation: str = text(choices=PCIE_GENERATIONS)
    year: int = number("year", 2000, 2030, integer=True)
    gigatransfers_per_s: float = number("GT/s", 1, 256)
    line_code: str = text()
    source: str = text()

    @property
    def encoding(self) -> float:
        """Fraction of the raw bits that carry data: 8b/10b → 0.8, 128b/130b → 0.985."""
        match = re.fullmatch(r"(\d+)[bB]/(\d+)[bB]", self.line_code)
        if not match:
            raise SpecError(f"PCIe {self.generation}: encoding {self.line_code!r} is not like '128b/130b'")
        return int(match[1]) / int(match[2])


@dataclass(frozen=True)
class GPULink:
    """A GPU-to-GPU link generation (NVLink, Infinity Fabric): bandwidth per link, each direction."""

    name: str = text()
    vendor: str = text(choices=("NVIDIA", "AMD"))
    year: int = number("year", 2010, 2030, integer=True)
    link_gbytes_per_s: float = number("GB/s", 1, 1000)
    max_links: int = number("links", 1, 64, integer=True)
    source: str = text()


@dataclass(frozen=True)
class Network:
    """A node-to-node network: nominal rate (what it is sold as) and data rate after line coding.

    >>> Network("InfiniBand QDR", "infiniband", 40, 32, source="IBTA").data_gbit_per_s
    32
    """

    name: str = text()
    kind: str = text(choices=("ethernet", "infiniband", "roce", "other"))  # roce: RDMA over Converged Ethernet
    gbit_per_s: float = number("Gbit/s", 0.001, 10000)
    data_gbit_per_s: float = number("Gbit/s", 0.001, 10000)
    year: int | None = number("year", 1980, 2030, integer=True, default=None)
    aliases: str | None = text(default=None)
    source: str | None = text(default=None)
