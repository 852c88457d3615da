"""The cost model's view of hardware, from a catalog cluster spec or from ``gpurig bench`` measurements.

Two sources, one result (a :class:`~gpurig.perf.step.Device` and a
:class:`~gpurig.perf.collectives.Topology`):

- a cluster spec (catalog GPUs, PCIe, network): datasheet peaks derated by
  the efficiencies below, which are assumptions and say so;
- a machine profile from ``gpurig bench`` (this machine, measured): GEMM
  constants fitted to its GEMM grid, memory bandwidth, per-layer overhead,
  codec costs, and the links' latency and bandwidth fitted to its allreduce
  measurements. Nothing in it comes from end-to-end training runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpurig.errors import UsageError
from gpurig.perf.collectives import Link, Topology
from gpurig.perf.compute import FastestGemm, GemmModel, fit_gemm_model
from gpurig.perf.precision import (MIXED, check_memory_format, cudnn_nhwc_batch_norm, precision_on,
                                   pytorch_nchw_batch_norm)
from gpurig.perf.software import check as check_software
from gpurig.perf.step import Device, layer_costs, layer_seconds, shape_key

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class GpuEfficiency:
    """What fraction of its datasheet peaks a GPU reaches in training, when nothing of it is measured.

    Fitted to published training throughputs (``benchmarks/published_validation.py``: 321 single-GPU
    rows of BERT-base, SSD300, ResNeXt101-32x4d, SE-ResNeXt101-32x4d and Transformer-XL base and large on 28 GPUs,
    each with the software release and memory format it ran on; the fit and its cross-validation are in
    docs/predict.md), never to the held-out ResNet-50 v1.5 and BERT-large results.
    """

    tensor_gemm: float = 0.6586     # of the tensor-core peak, on large GEMMs (Ampere; other architectures below)
    cuda_gemm: float = 0.9524         # of the FP32 CUDA-core peak, on large GEMMs
    conv: float = 1.446             # a TF32 convolution on tensor cores (implicit GEMM) against a plain GEMM of its shape
    # the same in mixed precision, on channels-last tensors (NCHW ones pay ``transposes`` besides); both bounded
    # only by the tensor-core peak
    conv_mixed: float = 1.442
    # a dense 3×3 stride-1 convolution on CUDA cores, where cuDNN's Winograd kernels cut its FLOPs by up to 2.25x,
    # against a plain GEMM of its shape (other convolutions on CUDA cores run as plain GEMMs)
    conv_cuda: float = 2.25
    memory: float = 0.7273          # of peak memory bandwidth, on streaming kernels (norms, activations)
    unhidden: float = 0.2651        # of a GEMM's shorter part, arithmetic or memory, not hidden under the longer
    flops_per_value: float = 231.3  # vector-unit operations per value transcendentals and random numbers move
    cache: float = 1.164            # memory-bound work on the share of its tensors the last cache holds, against memory
    # 16-bit tensor-core convolutions on NCHW tensors (``--memory-format contiguous``, PyTorch's default): the extra
    # traffic of the transposes around cuDNN's NHWC kernels, in passes over the convolution's input and output (1:
    # each read and written once more in forward, their gradients twice that in backward)
    transposes: float = 0.8115
    # per layer, forward + backward: the host's dispatch and autograd bookkeeping (measured, not fitted: the
    # published rows' batches are too large to show it; 150 µs on an H100 machine's CPU, 70-85 µs here)
    layer_overhead_s: float = 90e-6
    # Per GPU architecture, its tensor cores' achieved rate against ``tensor_gemm``'s: the kernels a generation
    # gets (Hopper's wgmma needs libraries newer than the published runs) and how far its boards sustain the
    # rated clock. Fitted like the rest; an architecture the published rows lack keeps 1.
    # Fitted only where the rows hold two GPUs of an architecture (the one B200 takes Hopper's: :data:`PRICED_AS`).
    # Turing's rows are all NGC 20.01's (PyTorch 1.4, apex AMP): that software's own factor (below, learned from the V100 and
    # GTX 1080 Ti rows of the same table) now takes its share, so Turing's is the hardware's.
    architecture: tuple[tuple[str, float], ...] = (("Ada Lovelace", 1.001), ("Hopper", 0.497), ("Turing", 0.823),
                                                   ("Volta", 1.046))
    # Per software release (:data:`gpurig.perf.software.RELEASES`), how fast it computes against current PyTorch:
    # ((release, "fp32" | "mixed"), factor) on every compute rate (GEMMs, streaming, the optimizer). A release the
    # published rows lack keeps 1; current PyTorch is 1 by definition.
    software: tuple[tuple[tuple[str, str], float], ...] = ((("pytorch-1.4", "fp32"), 0.7885),
                                                           (("pytorch-1.4", "mixed"), 0.7572),
                                                           (("pytorch-1.7", "fp32"), 0.8577),
                                                           (("pytorch-1.7", "mixed"), 0.9852))

    # A board's power for its SMs: below ``watts_per_unit`` watts of TDP per SM it cannot hold its rated clock
    # under a training load, and computes ``(watts per SM / watts_per_unit) ** power_exponent`` of its peaks
    # (memory's clock is its own; :meth:`power_scale`): a 150 W A10 (2.1 W per SM) 0.61 of them, a 250 W A100
    # PCIe 40 GB (2.3) 0.83, a 300 W A100 PCIe 80 GB (2.8), a 450 W RTX 4090 (3.5) or a 700 W H100 (5.3) all.
    # Fitted after the rest, with the rest fixed (``benchmarks/published_validation.py``), so that it moves only
    # the boards short of power.
    power_exponent: float = 3.0
    watts_per_unit: float = 2.461
    # Per GPU architecture, its CUDA cores' achieved rate against ``cuda_gemm``'s, which the published rows (Pascal
    # and later, whose SM is Maxwell's) fix. Not fitted (no published row is older): NVIDIA's GeForce GTX 750 Ti
    # whitepaper (2014) gives Maxwell's SM 1.35x the performance per CUDA core of Kepler's (issue and scheduling:
    # Kepler's cores idle unless two independent instructions are ready), so Kepler runs at 1 / 1.35.
    cuda_architecture: tuple[tuple[str, float], ...] = (("Kepler", 0.741),)
    # Of the FP32 peak, a GEMM on the CUDA cores of an SM whose four schedulers each drive 32 FP32 lanes
    # (:func:`wide_issue`: GA10x Ampere, Ada, Hopper, Blackwell), in place of ``cuda_gemm`` (fitted on the published
    # rows' Pascal, Volta and Turing GPUs, whose FP32 products these are). At its peak such a scheduler issues an FFMA every
    # cycle, so a GEMM's shared-memory loads take issue slots from them; Volta's and Turing's 16 lanes a scheduler
    # (an FFMA every other cycle) and Maxwell's and Pascal's dual issue leave slots for the loads. Measured, not
    # fitted (the published rows run their GEMMs on tensor cores there): ``gpurig bench``'s FP32 GEMM grid reached
    # 50.3 TFLOPS of an H100 SXM's 66.9 and 50.7 of an H200's (docs/gpu/h100-2026-11-26/gpu_validation-profile.json,
    # docs/gpu/h200-2026-11-27/second/gpu_validation.json), while catalog predictions of FP32 transformers on both
    # were 15-29 % fast and the measured-GEMM ones within 5 % (docs/predict.md).
    wide_issue_gemm: float = 0.75

    def architecture_scale(self, architecture: str, segment: str | None = None) -> float:
        """The tensor-core factor of ``architecture`` (for its GPUs of ``segment``): its own where one was fitted,
        else that of the generation its kernels descend from (:data:`PRICED_AS`), else 1.

        >>> GpuEfficiency(architecture=(("Hopper", 0.8),)).architecture_scale("Hopper")
        0.8
        >>> GpuEfficiency().architecture_scale("Pascal")       # no tensor cores, no factor
        1.0
        >>> e = GpuEfficiency(architecture=(("Hopper", 0.5), ("Ada Lovelace", 1.04)))
        >>> e.architecture_scale("Blackwell", "datacenter"), e.architecture_scale("Blackwell", "consumer")
        (0.5, 1.04)
        """
        fitted = dict(self.architecture)
        if architecture in fitted:
            return fitted[architecture]
        return fitted.get(PRICED_AS.get((architecture, segment)), 1.0)

    def cuda_core_scale(self, architecture: str) -> float:
        """The CUDA-core factor of ``architecture`` against ``cuda_gemm`` (1 from Maxwell on).

        >>> GpuEfficiency().cuda_core_scale("Kepler"), GpuEfficiency().cuda_core_scale("Maxwell")
        (0.741, 1.0)
        """
        return dict(self.cuda_architecture).get(architecture, 1.0)

    def gemm_issue_scale(self, gpu) -> float:
        """The share of ``cuda_gemm``'s rate a GEMM on ``gpu``'s CUDA cores reaches for its schedulers' issue:
        ``wide_issue_gemm / cuda_gemm`` on an SM of 32 FP32 lanes a scheduler (:func:`wide_issue`), else 1.

        >>> from gpurig.spec import catalog
        >>> e = GpuEfficiency(cuda_gemm=1.0, wide_issue_gemm=0.75)
        >>> [e.gemm_issue_scale(catalog.gpu(g)) for g in ("H100", "RTX 3090", "A100", "V100")]
        [0.75, 0.75, 1.0, 1.0]
        """
        return self.wide_issue_gemm / self.cuda_gemm if wide_issue(gpu) else 1.0

    def power_scale(self, gpu) -> float:
        """The share of its peaks ``gpu`` computes at for its power: ``(TDP / SMs / watts_per_unit) **
        power_exponent``, at most 1, the watts per SM taken as at least :data:`LOWEST_WATTS_PER_UNIT`; 1 where the
        catalog lacks the TDP or the SM count.

        >>> from gpurig.spec import catalog
        >>> e = GpuEfficiency(power_exponent=0.5, watts_per_unit=3.0)
        >>> round(e.power_scale(catalog.gpu("A10")), 3), e.power_scale(catalog.gpu("H100 SXM5 80 GB"))
        (0.833, 1.0)
        """
        watts, units = getattr(gpu, "tdp_w", None), getattr(gpu, "compute_units", None)
        if not watts or not units or not self.power_exponent:
            return 1.0
        return min(1.0, max(watts / units, LOWEST_WATTS_PER_UNIT) / self.watts_per_unit) ** self.power_exponent

    def software_scale(self, release: str, precision: str) -> float:
        """How fast ``release`` computes ``precision`` against current PyTorch (1 where none was fitted).

        >>> e = GpuEfficiency(software=((("pytorch-1.4", "mixed"), 0.7),))
        >>> e.software_scale("pytorch-1.4", "fp16"), e.software_scale("pytorch-1.4", "fp32"), e.software_scale("current", "fp16")
        (0.7, 1.0, 1.0)
        """
        from gpurig.perf.precision import MIXED

        return dict(self.software).get((release, "mixed" if precision in MIXED else "fp32"), 1.0)


GPU_EFFICIENCY = GpuEfficiency()
# A generation the published rows cannot fit a factor to (one GPU of it, or none) is priced as the one its
# tensor-core kernels descend from, not as Ampere: its first published runs use libraries written for that one.
# The data-centre Blackwell (B200, sm_100, tcgen05) follows Hopper (sm_90, wgmma), whose own first runs lacked its
# kernels: Lambda's B200 on NGC 24.xx ran BERT-base 1.6-2.0x an H100 SXM's rate (fp16, TF32), where Ampere's
# factor priced it at 2.1-2.6x and Hopper's at 1.8-2.0x. The GeForce and workstation Blackwells (sm_120, mma as on
# Ada) follow Ada.
PRICED_AS = {("Blackwell", "datacenter"): "Hopper", ("Blackwell", "consumer"): "Ada Lovelace",
             ("Blackwell", "workstation"): "Ada Lovelace"}
# The least TDP per SM of the GPUs ``power_exponent`` is fitted on (the A10's 150 W over 72 SMs): a board below it
# (a 72 W L4 has 1.24) is priced as if it had this much, not by a power law followed past its data
LOWEST_WATTS_PER_UNIT = 2.08

# Assumptions used when nothing is measured.
LINK_EFFICIENCY = 0.9          # of a link's data rate, after protocol overhead (PCIe, NVLink, RDMA)
TCP_EFFICIENCY = {10: 0.93, 1e9: 0.6}  # TCP over Ethernet: up to 10 Gbit/s near line rate (0.93-0.96 measured
                                        # here at 1 Gbit/s); faster links outrun one TCP stream's CPU
KERNEL_OVERHEAD_S = 5e-6       # per GPU kernel launch
# RoCE (RDMA over Converged Ethernet) moves data by RDMA as InfiniBand does, through Ethernet switches: a little
# more latency, the same efficiency; plain Ethernet is TCP (below)
LATENCY_S = {"infiniband": 2e-6, "roce": 3e-6, "ethernet": 30e-6, "other": 30e-6, "pcie": 5e-6, "nvlink": 3e-6}
RDMA_KINDS = ("infiniband", "roce")
JITTER = 0.03                 # a GPU rank's step-to-step variation of compute time (for the slowest-rank wait)
# memory passes per value, encode + decode, at the GPU's streaming rate: on an H100 with the Triton encoders and
# CUDA graphs (docs/benchmarks.md, "Codecs on a GPU") int8 took 0.065 ms for 2.4 M values (16 passes at the fitted
# ``memory`` share of its bandwidth), int8-dynamic 1.14x that
# FP32 lanes per SM, to read an SM's clock off the catalog's FP32 peak (2 operations a lane a cycle); two where an
# architecture's data-centre die has half the lanes (GP100, GA100: the clock the other count implies is below 0.9 GHz)
FP32_LANES = {"Kepler": (192,), "Maxwell": (128,), "Pascal": (128, 64), "Volta": (64,), "Turing": (64,),
              "Ampere": (128, 64), "Ada Lovelace": (128,), "Hopper": (128,), "Blackwell": (128,)}


# The architectures whose SMs, where they have 128 FP32 lanes, give each of their four schedulers 32 of them and
# issue one instruction a scheduler a cycle (Maxwell's and Pascal's 128 lanes have dual issue)
WIDE_ISSUE = ("Ampere", "Ada Lovelace", "Hopper", "Blackwell")


def fp32_lanes(gpu) -> int | None:
    """The FP32 lanes an SM of a catalog GPU has: of its architecture's counts (:data:`FP32_LANES`), the one at
    which its FP32 peak implies a clock between 0.9 and 2.8 GHz; None without its SMs.

    >>> from gpurig.spec import catalog
    >>> [fp32_lanes(catalog.gpu(g)) for g in ("H100", "A100", "V100", "RTX 3090", "P100", "GTX 1080 Ti")]
    [128, 64, 64, 128, 64, 128]
    """
    units, fp32 = getattr(gpu, "compute_units", None), getattr(gpu, "fp32_tflops", None)
    if not units or not fp32:
        return None
    counts = FP32_LANES.get(gpu.architecture, (128, 64))
    return next((lanes for lanes in counts if 0.9e9 <= fp32 * 1e12 / (2 * units * lanes) <= 2.8e9), counts[0])


def wide_issue(gpu) -> bool:
    """Whether ``gpu``'s SM schedulers each drive 32 FP32 lanes with one instruction a cycle (:data:`WIDE_ISSUE`,
    128 lanes an SM): GA10x Ampere, Ada, Hopper and Blackwell; not GA100 (the A100's 64), Volta or Pascal.

    >>> from gpurig.spec import catalog
    >>> [wide_issue(catalog.gpu(g)) for g in ("RTX 4090", "A100", "GTX 1080 Ti")]
    [True, False, False]
    """
    return gpu.architecture in WIDE_ISSUE and fp32_lanes(gpu) == 128


def sm_clock_hz(gpu) -> float | None:
    """The SM clock a catalog GPU's FP32 peak implies (its SMs × FP32 lanes × 2 × clock); None without its SMs.

    >>> from gpurig.spec import catalog
    >>> [round(sm_clock_hz(catalog.gpu(g)) / 1e9, 2) for g in ("H100", "A100", "V100", "RTX 3090", "P100")]
    [1.98, 1.41, 1.53, 1.69, 1.48]
    """
    lanes = fp32_lanes(gpu)
    return gpu.fp32_tflops * 1e12 / (2 * gpu.compute_units * lanes) if lanes else None


CODEC_PASSES = {"fp16": 6, "bf16": 6, "int8": 16, "int8-dynamic": 18}
# Output tiles: tensor-core GEMMs and convolutions choose among several (cuBLAS, CUTLASS, cuDNN); pre-Volta cuBLAS
# used 64 x 128, the source's rule.
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
OLD_TILE = (64, 128)
# Convolutions on CUDA cores (FP32, and grouped ones in TF32: :func:`gpu_device`): cuDNN's FP32 implicit-GEMM
# kernels tile 128 output pixels by 128, 64 or 32 output channels (their names in a profile:
# ``volta_scudnn_128x128_relu_interior_nn``, ``..._128x64_...``, ``..._128x32_...``), so a convolution with few
# output channels (a detection head's 16 box coordinates, a ResNeXt group's 4-32) is not padded to 128.
CONV_CUDA_TILES = ((128, 128), (128, 64), (128, 32))


def gpu_device(gpu, precision: str = "fp32", efficiency: GpuEfficiency | None = None,
               software: str = "current", memory_format: str = "contiguous") -> Device:
    """A catalog GPU as the cost model sees it at ``precision`` (:mod:`gpurig.perf.precision`), run by ``software``
    (:mod:`gpurig.perf.software`: every compute rate times the release's factor), its convolutions' activations in
    ``memory_format`` (:data:`~gpurig.perf.precision.MEMORY_FORMATS`: NCHW 16-bit tensor-core convolutions transpose).

    >>> from gpurig.spec import catalog
    >>> d = gpu_device(catalog.gpu("V100"), "fp16")
    >>> round(d.gemm.flops_per_s / 1e12, 1), d.gemm.tile[2], d.element_bytes
    (86.1, (128, 128), 2)
    >>> a100 = gpu_device(catalog.gpu("A100"))     # PyTorch's default: convolutions in TF32, matmuls in FP32
    >>> round(a100.gemm.flops_per_s / 1e12, 1), round(a100.conv_gemm.flops_per_s / 1e12, 1)
    (18.6, 148.6)
    """
    missing = [name for name in ("fp32_tflops", "memory_bandwidth_gbs") if getattr(gpu, name, None) is None]
    if missing:   # a GPU the catalog lacks, as `doctor --write-spec` describes it: its peaks are not known
        raise UsageError(f"{gpu.name} is not in the catalog and its [nodes.gpu] table gives no {' or '.join(missing)}: "
                         "add them (and tensor_tflops, bf16_tflops … for mixed precision) from its data sheet")
    e = efficiency or GPU_EFFICIENCY
    p = precision_on(gpu, precision)
    check_memory_format(memory_format)
    speed = e.software_scale(check_software(software), precision)
    memory = gpu.memory_bandwidth_gbs * 1e9 * e.memory * speed
    units = getattr(gpu, "compute_units", None)

    clock = e.power_scale(gpu)
    tensor = e.tensor_gemm * e.architecture_scale(gpu.architecture, getattr(gpu, "segment", None)) * clock
    cuda = e.cuda_gemm * e.cuda_core_scale(gpu.architecture) * clock
    # dense products on the CUDA cores are bound by their schedulers' issue; not the vector units' own work
    # (``vector_flops_per_s``), nor grouped convolutions (below), whose few channels a group leave slots to spare
    issue = e.gemm_issue_scale(gpu)

    def gemm(tflops: float, tensor_cores: bool, scale: float = 1.0, tiles=None, dense: bool = True) -> GemmModel:
        rate = tflops * 1e12 * (tensor if tensor_cores else cuda * (issue if dense else 1.0)) * scale * speed
        return GemmModel(KERNEL_OVERHEAD_S, rate, memory, tiles or (TILES if tensor_cores else OLD_TILE), units,
                         e.unhidden)

    linear = gemm(p.linear_tflops, p.linear_tensor_cores)
    tensor_conv = e.conv_mixed if precision in MIXED else e.conv
    # on CUDA cores a convolution is an implicit GEMM like any other (1×1, strided and grouped ones), in cuDNN's
    # FP32 kernels' tiles
    conv = gemm(p.conv_tflops, p.conv_tensor_cores, tensor_conv if p.conv_tensor_cores else 1.0,
                None if p.conv_tensor_cores else CONV_CUDA_TILES)
    # Grouped convolutions in TF32 (ResNeXt's 3×3s, 4-32 channels a group) run cuDNN's FP32 grouped kernels on the
    # CUDA cores, as on a GPU without TF32, not its tensor-core ones (which it has for 16-bit NHWC tensors); the
    # V100's FP32 ResNeXt rows fix those kernels' pricing
    grouped = gemm(p.cuda_tflops, False, tiles=CONV_CUDA_TILES, dense=False) \
        if precision not in MIXED and p.conv_tensor_cores else None
    # cuDNN tries every algorithm (DeepLearningExamples set cudnn.benchmark): for a dense 3×3 stride-1 convolution
    # (:func:`gpurig.perf.step.winograd_applies`) that includes the CUDA cores' Winograd kernels, which win where
    # there are no tensor cores for this type or they are slow (GeForce TF32 is half rate)
    winograd = FastestGemm((conv, gemm(p.cuda_tflops, False, e.conv_cuda)))
    # encode (with error feedback) is about two thirds of the passes, decode one third
    per_value = {name: (passes * 4 / memory * 2 / 3, passes * 4 / memory / 3) for name, passes in CODEC_PASSES.items()}
    return Device(gpu.name, linear, memory, e.layer_overhead_s, is_gpu=True, codec_seconds_per_value=per_value,
                  jitter=JITTER, conv_gemm=conv if conv != linear else None, winograd_gemm=winograd,
                  element_bytes=p.element_bytes,
                  cast_bytes_per_param=p.cast_bytes_per_param, flops_per_value=e.flops_per_value,
                  vector_flops_per_s=gpu.fp32_tflops * 1e12 * cuda * speed,
                  cache_bytes=(getattr(gpu, "cache_mb", None) or 0) * 2**20, cache_speedup=e.cache,
                  conv_transposes=e.transposes if precision in MIXED and p.conv_tensor_cores
                  and memory_format == "contiguous" else 0.0, grouped_gemm=grouped,
                  nchw_batch_norm_units=(units or 0) if pytorch_nchw_batch_norm(precision, memory_format) else 0,
                  sm_cycles_per_s=units * sm_clock_hz(gpu) * clock * speed if units else 0.0,
                  cudnn_nhwc_batch_norm=cudnn_nhwc_batch_norm(precision, memory_format))


def nvlink_ring(gpu, gpus: int, ranks: int) -> bool:
    """Whether a ring over ``ranks`` of a node's ``gpus`` GPUs runs on NVLink: the GPU has it, and either the ring
    joins two cards or they are SXM modules (NVSwitch, or DGX-1's mesh). A PCIe card's NVLink bridge joins two
    cards; a ring over more crosses PCIe between the pairs.

    >>> from gpurig.spec import catalog
    >>> [nvlink_ring(catalog.gpu(g), 4, r) for g, r in (("RTX 3090", 2), ("RTX 3090", 4), ("A100", 4), ("RTX 4090", 2))]
    [True, False, True, False]
    """
    return bool(getattr(gpu, "gpu_link_gbs", None)) and gpus > 1 and ranks > 1 and \
        (ranks <= 2 or getattr(gpu, "form_factor", None) != "pcie")


def spec_topology(spec, pcie_bytes_per_s: float | None = None, network_efficiency: float | None = None) -> Topology:
    """Nodes, GPUs per node and the links between them, from a cluster spec.

    Inside a node GPUs talk over NVLink when the catalog lists it, else PCIe;
    between nodes over the spec's network, one NIC per node shared by its GPUs,
    staged through host memory unless the spec says GPUDirect RDMA.

    >>> from gpurig.spec.describe import parse_description
    >>> t = spec_topology(parse_description("2 nodes x 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand"))
    >>> t.nodes, t.gpus_per_node, round(t.network.bytes_per_s / 1e9, 2), t.staging is not None
    (2, 4, 4.5, True)
    """
    from gpurig.perf.transfer import pcie_bytes_per_s as pcie_rate, slower_link

    node = spec.nodes[0]
    gpu = node.gpu
    pcie = pcie_bytes_per_s or pcie_rate(*slower_link((node.pcie_gen, gpu.pcie_gen if gpu else None),
                                                      (node.pcie_lanes, gpu.pcie_lanes if gpu else None)))
    pcie_link = Link(LATENCY_S["pcie"], pcie * LINK_EFFICIENCY)
    local = pcie_link
    if gpu is not None and nvlink_ring(gpu, node.gpus, node.gpus):
        # NVLink's catalog figure is both directions together: half each way.
        local = Link(LATENCY_S["nvlink"], gpu.gpu_link_gbs * 1e9 / 2 * LINK_EFFICIENCY)
    network = pcie_link
    if spec.network is not None:
        kind = spec.network.kind if spec.network.kind in LATENCY_S else "other"
        gbit = spec.network.data_gbit_per_s
        efficiency = LINK_EFFICIENCY
        if kind not in RDMA_KINDS and not spec.gpudirect_rdma:  # TCP, not RDMA
            efficiency = next(e for limit, e in sorted(TCP_EFFICIENCY.items()) if gbit <= limit)
        efficiency = network_efficiency or efficiency
        network = Link(LATENCY_S[kind], gbit * 1e9 / 8 * efficiency)
    return Topology(nodes=spec.node_count, gpus_per_node=max(node.gpus, 1), local=local, network=network,
                    nic_shared=True, staging=None if spec.gpudirect_rdma else pcie_link)


def profile_device(profile: dict, ranks_per_node: int, catalog: Device | None = None) -> Device:
    """This machine as ``gpurig bench`` measured it with ``ranks_per_node`` ranks computing at once.

    Uses the compute measurements taken with that many ranks (or the nearest count measured). ``catalog``: the
    same GPU as the catalog prices it (:func:`gpu_device`, in FP32), for what bench does not measure. bench
    times its GEMMs in FP32 with TF32 off, which is what ``--precision fp32`` runs matrix multiplies in, while
    PyTorch runs convolutions in TF32 on tensor cores by default; so the measured GEMMs price the matrix
    multiplies, the catalog's models the convolutions, and the measured memory rate, per-layer cost, optimizers
    and codecs the rest. Without it every product is priced by the FP32 GEMMs (a VGG-16 on an H100 +115 %).

    >>> import json
    >>> from gpurig.spec import catalog as parts
    >>> profile = json.load(open("docs/gpu/h100-2026-11-26/gpu_validation-profile.json"))["profile"]  # doctest: +SKIP
    >>> d = profile_device(profile, 1, gpu_device(parts.gpu("H100 SXM")))                            # doctest: +SKIP
    >>> round(d.gemm.flops_per_s / 1e12), round(d.conv_gemm.flops_per_s / 1e12)  # FP32 measured, TF32 catalog  # doctest: +SKIP
    (51, 212)
    """
    measured = profile.get("compute")
    if not measured:
        raise ValueError("the profile has no compute measurements: run gpurig bench with the compute part")
    key = min(measured, key=lambda k: abs(int(k) - ranks_per_node))
    data = measured[key]
    gemm = fit_gemm_model(data["gemm"])
    codecs = {name: (c["encode_s_per_value"], c["decode_s_per_value"]) for name, c in data["codecs"].items()}
    is_gpu = data["device"].startswith("cuda")
    measured = dict(gemm=gemm, memory_bytes_per_s=data["memory_bytes_per_s"], layer_overhead_s=data["layer_overhead_s"],
                    codec_seconds_per_value=codecs, jitter=data.get("jitter", JITTER),
                    optimizer_rows=tuple((r["optimizer"], r["values"], r["seconds_per_value"])
                                         for r in data.get("optimizers", [])))
    if is_gpu and catalog is not None:
        # bench's real layers are not applied here: timed one at a time, a GPU layer's time holds its launch and
        # synchronisation, which a step hides by queueing ahead (on the H100's profile they made the steps 18 to
        # 79 % slow; without them median 5 %, worst 16 %, docs/predict.md)
        return replace(catalog, name=profile.get("device", catalog.name), **measured)
    device = Device(profile.get("device", "cpu"), is_gpu=is_gpu, **measured)
    return replace(device, layer_ratios=layer_ratios(device, data.get("layers", [])))


def build_layer(kind: str, arguments: tuple) -> "torch.nn.Module":
    """The torch module a ``bench`` layer measurement (:data:`gpurig.measure.compute.LAYER_GRID`) times.

    >>> build_layer("conv", (1, 32, 5))
    Conv2d(1, 32, kernel_size=(5, 5), stride=(1, 1))
    """
    import torch

    make = {"linear": torch.nn.Linear, "conv": torch.nn.Conv2d, "pool": torch.nn.MaxPool2d,
            "activation": torch.nn.ReLU}[kind]
    return make(*arguments)


def layer_ratios(device: Device, rows: list[dict]) -> tuple[tuple[str, tuple[int, ...], float, float], ...]:
    """Per layer ``bench`` measured: its kind, :func:`~gpurig.perf.step.shape_key`, and its forward's and
    backward's measured time over what ``device``'s models give the same layer, described as the predictor
    describes any model.

    >>> d = Device("cpu", GemmModel(0, 1e9, 1e12), 1e10)
    >>> row = {"kind": "linear", "arguments": [100, 10], "input": [64, 100], "input_grad": False,
    ...        "forward_s": 2 * 2 * 64 * 10 * 100 / 1e9, "backward_s": 3 * 2 * 64 * 10 * 100 / 1e9}
    >>> layer_ratios(d, [row])
    (('linear', (64, 10, 100, 1), 2.0, 3.0),)
    """
    import torch

    from gpurig.models.describe import describe

    out = []
    for row in rows:
        example = torch.empty(1, *row["input"][1:], requires_grad=row["input_grad"])
        spec = describe(build_layer(row["kind"], tuple(row["arguments"])), example, batch=row["input"][0])
        layer = layer_costs(spec)[0]
        forward, backward = layer_seconds(layer, device, in_step=False)
        key = shape_key(layer)
        if key is not None and forward > 0 and backward > 0:
            # four significant digits, not three decimals: a ratio of 0.2 kept to 0.001 is 0.25 % off
            out.append((layer.kind, key, float(f"{row['forward_s'] / forward:.4g}"),
                        float(f"{row['backward_s'] / backward:.4g}")))
    return tuple(out)


def allreduce_link(alpha_s: float, beta_s_per_byte: float, ranks: int) -> Link:
    """The per-hop link that makes a ring allreduce over ``ranks`` take alpha + n·beta (a bench fit).

    A ring allreduce of n bytes takes 2(P−1)·α_link + 2(P−1)/P·n·β_link, so
    α_link = α / 2(P−1) and β_link = β·P / 2(P−1).

    >>> link = allreduce_link(40e-6, 2e-9, 2)
    >>> round(link.latency_s * 1e6, 1), round(link.bytes_per_s / 1e9, 2)
    (20.0, 0.5)
    """
    hops = 2 * (ranks - 1)
    return Link(alpha_s / hops, hops / (ranks * beta_s_per_byte))


def profile_topology(profile: dict, engine: str, nodes: int = 1) -> Topology:
    """The links ``gpurig bench`` measured: one allreduce fit, as ``nodes`` nodes of the profile's ranks."""
    comm = profile.get("comm")
    if not comm or engine not in comm["engines"]:
        have = ", ".join(comm["engines"]) if comm else "none"
        raise ValueError(f"the profile has no allreduce measurements for engine {engine!r} (it has: {have})")
    fit = comm["engines"][engine]["allreduce"]
    ranks = comm["ranks"]
    link = allreduce_link(max(fit["alpha_s"], 0.0), fit["beta_s_per_byte"], ranks)
    per_node = max(1, ranks // nodes)
    return Topology(nodes=nodes, gpus_per_node=per_node, local=link, network=link, nic_shared=True)
