"""One training step of data parallelism, predicted: compute per layer, the gradients' trip, the rest.

A rank runs forward, then backward from the last layer to the first; as each
bucket of gradients is complete it is averaged over the ranks
(:mod:`gpurig.perf.collectives`) while backward goes on, and what is still
travelling when backward ends is waited for (:mod:`gpurig.perf.overlap`). Then
the optimizer updates the weights. Around it: the batch is loaded (from disk,
blocking or read ahead) and copied to the device over PCIe.

Everything is in seconds per step per rank, split into the terms ``gpurig
train`` measures: compute, communication not hidden (comm), data.

>>> layer = LayerCost("fc", params=1_000_000, forward_gemms=((64, 1000, 1000),),
...                   backward_gemms=tuple(backward_of((64, 1000, 1000))))
>>> device = Device("test", GemmModel(0, 1e11, 1e11), memory_bytes_per_s=1e10, layer_overhead_s=0)
>>> step = predict_step([layer], device, DataParallelSetup(ranks=1))
>>> round(step.forward_s * 1000, 2), round(step.backward_s * 1000, 2), round(step.optimizer_s * 1000, 2)
(1.68, 2.56, 2.0)

(Forward: 1.28 ms of GEMM and 0.4 ms reading the 4 MB of weights from memory.)
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field

from gpurig.perf import optimizer as optimizer_cost
from gpurig.perf import overlap
from gpurig.perf.collectives import Topology, allreduce_seconds, best_allreduce
from gpurig.perf.compute import DTYPE_BYTES, GemmModel, memory_seconds


@dataclass(frozen=True)
class LayerCost:
    """What one layer costs a rank per step: its parameter tensors, its GEMMs, other memory traffic.

    GEMMs are (m, n, k) — a product of (m × k)·(k × n) — or (m, n, k, batch) for
    ``batch`` such products run as one batched GEMM (attention's heads).
    :func:`backward_of` gives the usual backward products of a forward one.
    """

    name: str
    params: int
    forward_gemms: tuple[tuple[int, ...], ...] = ()
    backward_gemms: tuple[tuple[int, ...], ...] = ()
    forward_bytes: float = 0.0         # traffic outside GEMMs (activations, norms, pooling)
    backward_bytes: float = 0.0
    param_sizes: tuple[int, ...] = ()  # each parameter tensor's values (weight, bias); default: one tensor
    kind: str = ""                     # "conv" for a convolution (its GEMMs are im2col's), "linear", ...
    activation_values: int = 0         # its largest activation tensor (input or output), per call
    input_values: int = 0              # values of its inputs, all calls together
    output_values: int = 0             # values of its outputs, all calls together
    # parts of forward_bytes / backward_bytes: vector-bound operators' (transcendentals, random numbers: their
    # arithmetic may outlast their traffic) and float32 operators' (autocast keeps them 4 bytes a value)
    forward_vector_bytes: float = 0.0
    backward_vector_bytes: float = 0.0
    forward_float32_bytes: float = 0.0
    backward_float32_bytes: float = 0.0
    # a dense 3×3 convolution of stride 1, which cuDNN may run with Winograd's kernels (:func:`winograd_applies`)
    winograd: bool = False
    # a batch norm: on NCHW bf16 tensors its kernels are PyTorch's own (:func:`nchw_batch_norm_scale`)
    batch_norm: bool = False
    # values of each parameter tensor that has a gradient (requires_grad), in registration order; None: every
    # tensor. A frozen one is read and cast like the others, but has no gradient, bucket or optimizer state.
    trainable_sizes: tuple[int, ...] | None = None

    def tensors(self) -> tuple[int, ...]:
        """Values of each parameter tensor, in registration order."""
        return self.param_sizes or ((self.params,) if self.params else ())

    def gradients(self) -> tuple[int, ...]:
        """Values of each gradient the layer's backward makes (its trainable tensors'), in registration order.

        >>> LayerCost("fc", 110, param_sizes=(100, 10), trainable_sizes=(10,)).gradients()
        (10,)
        """
        return self.tensors() if self.trainable_sizes is None else self.trainable_sizes


def backward_of(gemm: tuple[int, ...], input_gradient: bool = True) -> list[tuple[int, ...]]:
    """The backward products of a forward (m, n, k[, batch]) product: dW = dYᵀ·X is (n, k, m), dX = dY·W (m, k, n).

    >>> backward_of((64, 1200, 784)), backward_of((64, 1200, 784), input_gradient=False)
    ([(1200, 784, 64), (64, 784, 1200)], [(1200, 784, 64)])
    >>> backward_of((128, 128, 64, 12))
    [(128, 64, 128, 12), (128, 64, 128, 12)]
    """
    m, n, k, *batch = gemm
    return [(n, k, m, *batch), (m, k, n, *batch)] if input_gradient else [(n, k, m, *batch)]


# Operators per layer in what a profile's per-layer fixed cost times (gpurig.measure.compute.layer_overhead_seconds:
# a stack of Linear(4, 4), forward and backward; addmm forward, two products and a sum backward, the first
# layer's one product fewer, the loss's sum; traced, views left out: tests/test_predict_gpu.py)
OPS_PER_MEASURED_LAYER = 4.05


@dataclass(frozen=True)
class Device:
    """What computes: a GEMM model, memory bandwidth, and the fixed cost per layer (dispatch, autograd)."""

    name: str
    gemm: GemmModel
    memory_bytes_per_s: float
    layer_overhead_s: float = 0.0     # per layer, forward and backward together (dispatch, autograd)
    is_gpu: bool = False
    codec_seconds_per_value: dict = field(default_factory=dict)   # codec -> (encode, decode) seconds per value
    # bench's real layers: (kind, shape key, forward ratio, backward ratio), each ratio the layer's measured
    # time over what the model gives it (:func:`gpurig.perf.machine.layer_ratios`)
    layer_ratios: tuple[tuple[str, tuple[int, ...], float, float], ...] = ()
    jitter: float = 0.0    # coefficient of variation of one rank's compute time from step to step
    # bench's optimizer steps: (optimizer, parameter values, seconds per value)
    optimizer_rows: tuple[tuple[str, int, float], ...] = ()
    conv_gemm: GemmModel | None = None   # convolutions' implicit GEMMs, where they run at another rate (TF32)
    # the convolutions Winograd's kernels can run (:attr:`LayerCost.winograd`): cuDNN's fastest of those and
    # ``conv_gemm``; None: as every other convolution
    winograd_gemm: GemmModel | None = None
    element_bytes: int = DTYPE_BYTES     # bytes of one activation value: 4, or 2 under mixed precision
    cast_bytes_per_param: float = 0.0    # mixed precision's weight and gradient casts, each pass, per parameter
    # Work outside GEMMs that evaluates transcendentals or random numbers (GELU, softmax, dropout's masks) also
    # computes on the vector units: ``flops_per_value`` operations per value it moves, at ``vector_flops_per_s``
    # (0: memory alone). ReLU, adds, norms and pooling are memory alone.
    vector_flops_per_s: float = 0.0
    flops_per_value: float = 0.0
    # A GPU's last cache: the share of a layer's input and output that fits in it together streams at
    # ``cache_speedup`` times the memory's rate (the tensor the kernel before it wrote is still there).
    cache_bytes: float = 0.0
    cache_speedup: float = 1.0
    # 16-bit tensor-core convolutions on NCHW tensors: each transposes its input and output to NHWC and back
    # (:data:`gpurig.perf.precision.MEMORY_FORMATS`), this many passes over them (0: none)
    conv_transposes: float = 0.0
    # Batch norm on NCHW bf16 tensors runs PyTorch's own NCHW kernels (cuDNN's take FP32 and FP16, not BF16), a
    # block per channel: the GPU's SMs, which decide how far its channels fill them (:func:`nchw_batch_norm_scale`;
    # 0: cuDNN's kernels, or channels-last)
    nchw_batch_norm_units: int = 0
    # SMs × their clock (cycles a second, all SMs together), for the kernels the SMs' own work bounds rather than
    # memory or tensor cores: batch norm's (:data:`BATCH_NORM_BYTES_PER_SM_CYCLE`) and PyTorch's direct depthwise
    # convolutions (:func:`depthwise_seconds`); 0: unknown (a CPU, a GPU whose SMs the catalog lacks)
    sm_cycles_per_s: float = 0.0
    # cuDNN's NHWC batch norm (FP16 on channels-last tensors: its persistent kernels) instead of the others
    cudnn_nhwc_batch_norm: bool = False
    # grouped convolutions' GEMMs, where they run on other units than dense ones (TF32: the CUDA cores); None: as
    # every other convolution
    grouped_gemm: GemmModel | None = None

    def stream_seconds(self, nbytes: float, working_set: float = math.inf,
                       vector: tuple[float, float] | None = None) -> float:
        """Seconds for ``nbytes`` of work outside GEMMs on tensors of ``working_set`` bytes together: its memory
        traffic (from the cache when the working set fits there), or, for its vector-bound part (``vector``: its
        bytes and values; default: all of it, ``element_bytes`` a value), its arithmetic where that is longer.

        >>> d = Device("gpu", None, 1e12, vector_flops_per_s=1e13, flops_per_value=20, element_bytes=2)
        >>> d.stream_seconds(1e9), Device("cpu", None, 1e12).stream_seconds(1e9)    # 5e8 values x 20 at 10 TFLOP/s
        (0.001, 0.001)
        >>> Device("gpu", None, 1e12, vector_flops_per_s=1e12, flops_per_value=20, element_bytes=2).stream_seconds(1e9)
        0.01
        >>> Device("gpu", None, 1e12, cache_bytes=4e7, cache_speedup=2.5).stream_seconds(1e9, working_set=3e7)
        0.0004
        >>> Device("gpu", None, 1e12, cache_bytes=4e7, cache_speedup=2.5).stream_seconds(1e9, working_set=8e7)
        0.0007
        >>> Device("gpu", None, 1e12, vector_flops_per_s=1e12, flops_per_value=20).stream_seconds(1e9, vector=(0, 0))
        0.001
        """
        # the share of the working set the cache holds streams at its rate, the rest at memory's
        held = min(1.0, self.cache_bytes / working_set) if working_set > 0 else 1.0
        memory = nbytes / self.memory_bytes_per_s * (1.0 - held + held / self.cache_speedup)
        if not self.vector_flops_per_s:
            return memory
        vector_bytes, values = vector if vector is not None else (nbytes, nbytes / self.element_bytes)
        # the vector-bound operators' share of the traffic takes the longer of its memory time and its arithmetic
        bound = memory * vector_bytes / nbytes if nbytes else 0.0
        return memory - bound + max(bound, values * self.flops_per_value / self.vector_flops_per_s)

    def gemm_for(self, layer: "LayerCost") -> GemmModel:
        """The GEMM model ``layer``'s products run on: convolutions' own where the device has one, and Winograd's
        choice for the dense 3×3 stride-1 ones.

        >>> plain, winograd = GemmModel(0, 1e12, 1e12), GemmModel(0, 2e12, 1e12)
        >>> d = Device("gpu", None, 1e12, conv_gemm=plain, winograd_gemm=winograd)
        >>> d.gemm_for(LayerCost("c", 0, kind="conv", winograd=True)) is winograd, d.gemm_for(LayerCost("c", 0, kind="conv")) is plain
        (True, True)
        """
        if layer.kind != "conv":
            return self.gemm
        if self.grouped_gemm is not None and any(len(g) > 3 and g[3] > 1 for g in layer.forward_gemms):
            return self.grouped_gemm
        if layer.winograd and self.winograd_gemm is not None:
            return self.winograd_gemm
        return self.conv_gemm or self.gemm

    def optimizer_seconds(self, optimizer: str, params: int, sizes=None, implementation: str = "fused") -> float:
        """One ``optimizer`` step over ``params`` values: bench's measurement nearest in size, scaled, or, with
        none, its kernels' passes over memory and the host's launches for tensors of ``sizes`` values (default:
        one tensor) run as ``implementation`` (:func:`gpurig.perf.optimizer.step_seconds`).

        >>> d = Device("cpu", None, 1e10, optimizer_rows=(("momentum", 1 << 18, 1e-9), ("momentum", 1 << 22, 2e-9)))
        >>> d.optimizer_seconds("momentum", 3_000_000), d.optimizer_seconds("sgd", 1000)
        (0.006, 1.2e-06)
        >>> gpu = Device("gpu", None, 1e12, layer_overhead_s=90e-6, is_gpu=True)
        >>> [round(gpu.optimizer_seconds("adam", 10**8, [10**6] * 100, i) * 1e3, 1) for i in ("fused", "for-loop")]
        [2.8, 7.2]
        """
        rows = [row for row in self.optimizer_rows if row[0] == optimizer]
        if not rows or params <= 0:
            return optimizer_cost.step_seconds(optimizer, implementation, sizes or [params], self.memory_bytes_per_s,
                                               self.layer_overhead_s, self.layer_overhead_s / OPS_PER_MEASURED_LAYER)
        nearest = min(rows, key=lambda row: abs(math.log(row[1] / params)))
        return params * nearest[2]

    def layer_scale(self, layer: "LayerCost") -> tuple[float, float]:
        """How much longer ``layer``'s forward and backward take than the model says: the ratios of the
        measured layers of its kind, weighted by closeness in shape (inverse squared log distance of
        :func:`shape_key`; a measured layer of the same shape gives its own ratios), (1, 1) when none was
        measured. Layers with an input gradient are compared with layers with one, where bench has any.

        >>> fc = LayerCost("fc", 0, ((64, 1024, 1024),), kind="linear")
        >>> d = Device("cpu", GemmModel(0, 1e9, 1e12), 1e10,
        ...            layer_ratios=(("linear", (32, 1024, 1024, 0), 1.2, 1.8), ("linear", (128, 1024, 1024, 0), 1.8, 1.2)))
        >>> d.layer_scale(fc), d.layer_scale(LayerCost("fc", 0, ((32, 1024, 1024),), kind="linear"))
        ((1.5, 1.5), (1.2, 1.8))
        >>> d.layer_scale(LayerCost("pool", 0, kind="pool"))
        (1.0, 1.0)
        """
        key = shape_key(layer)
        rows = [row for row in self.layer_ratios if key and row[0] == layer.kind and len(row[1]) == len(key)]
        if rows and len(key) == 4:  # the same number of backward products, where measured
            rows = [row for row in rows if row[1][3] == key[3]] or rows
        if not rows:
            return 1.0, 1.0
        measures = key[:3] if len(key) == 4 else key
        weights = []
        for row in rows:
            distance = sum(math.log(max(a, 1) / max(b, 1)) ** 2 for a, b in zip(measures, row[1]))
            if distance < 1e-12:
                return row[2], row[3]
            weights.append(1.0 / distance)
        total = sum(weights)
        return (sum(w * row[2] for w, row in zip(weights, rows)) / total,
                sum(w * row[3] for w, row in zip(weights, rows)) / total)


def shape_key(layer: "LayerCost") -> tuple[int, ...] | None:
    """What makes two layers of a kind comparable: their first GEMM's (m, n, k) and backward product count,
    or for a layer without GEMMs the bytes its forward moves.

    >>> shape_key(LayerCost("fc", 0, ((64, 1200, 784),), ((1200, 784, 64),), kind="linear"))
    (64, 1200, 784, 1)
    >>> shape_key(LayerCost("pool", 0, forward_bytes=4096, kind="pool"))
    (4096,)
    """
    if layer.forward_gemms:
        m, n, k = layer.forward_gemms[0][:3]
        return (m, n, k, len(layer.backward_gemms))
    return (int(layer.forward_bytes),) if layer.forward_bytes else None


@dataclass(frozen=True)
class DataParallelSetup:
    """How the step is run: ranks and their topology, buckets, compression, optimizer, input path."""

    ranks: int = 1
    topology: Topology | None = None
    algorithm: str = "best"            # ring | tree | hierarchical | naive | best
    bucket_of_tensor: tuple[int, ...] = ()   # bucket of every parameter tensor, model order (default: one bucket)
    # With compression, per bucket: the bytes a ring allreduce of its payload would carry, and the codec's
    # arithmetic (:mod:`gpurig.perf.codec`); empty: float32 gradients, no codec.
    bucket_payload_bytes: tuple[float, ...] = ()
    bucket_codec_s: tuple[float, ...] = ()
    collectives_per_bucket: int = 1
    compute_slowdown: float = 1.0      # backward's pace while a bucket travels (bench: overlap)
    posted_s: float = 0.0              # what posting a bucket under backward costs it (bench: overlap)
    # per bucket, what posting it under backward costs it, measured for compressed buckets on CPU ranks (bench:
    # the chain's hand-offs and arithmetic on the cores beside backward), replacing posted_s and its codec there:
    # (seconds for any bucket, seconds this bucket's size adds)
    bucket_posted_s: tuple[tuple[float, float], ...] = ()
    bucket_seconds: tuple[float, ...] = ()  # per bucket, its measured averaging time, replacing the models
    optimizer: str = "momentum"
    # how the optimizer runs on a GPU without a measured step (gpurig.perf.optimizer.IMPLEMENTATIONS)
    optimizer_impl: str = "fused"
    shard: str = "none"                # ZeRO (gpurig train --shard): the update on 1/N, reduce-scatter + allgather
    input_bytes: float = 0.0           # one rank's batch, as it crosses PCIe
    host_to_device_bytes_per_s: float | None = None
    load_seconds: float = 0.0          # reading one rank's batch from storage
    prefetch: bool = True
    pinned: bool = True                # the batch in pinned host memory: its copy can run beside compute
    # (forward, backward) operators the step dispatches, traced (:func:`gpurig.models.peak.trace_step`): on a GPU
    # the host launches them one by one, each at the per-layer fixed cost over OPS_PER_MEASURED_LAYER
    host_ops: tuple[int, int] = ()


def input_seconds(load_s: float, copy_s: float, busy_s: float, prefetch: bool = True, pinned: bool = True) -> float:
    """What reading the next batch (``load_s``) and copying it to the GPU (``copy_s``) add to a step that computes
    for ``busy_s``: read ahead by loader workers, and from pinned memory copied asynchronously
    (``non_blocking=True``), both run beside compute and only their excess counts (the hardware guide: 0 % with
    pinned-memory prefetch); a pageable copy blocks, and without prefetch so does the read.

    >>> input_seconds(0.002, 0.003, 0.1), input_seconds(0.002, 0.003, 0.1, pinned=False)
    (0.0, 0.003)
    >>> input_seconds(0.002, 0.003, 0.1, prefetch=False), input_seconds(0.5, 0.003, 0.1)
    (0.005, 0.4)
    """
    if not prefetch:
        return load_s + copy_s
    hidden_copy = copy_s if pinned else 0.0
    return max(0.0, max(load_s, hidden_copy) - busy_s) + (copy_s - hidden_copy)


@dataclass
class StepPrediction:
    """Seconds per step, split as ``gpurig train`` reports it, plus the detail behind each part."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    comm_total_s: float
    comm_s: float          # not hidden under backward
    codec_s: float
    data_s: float
    buckets: list[dict]
    layers: list[dict]
    wait_s: float = 0.0    # for the slowest rank: every step lasts as long as its slowest rank's
    input_s: float = 0.0   # the input path's whole time (reading and copying a batch), hidden under compute or not
    host_s: float = 0.0    # on a GPU, the host's launches of forward's and backward's operators (0: not traced)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s + self.wait_s + self.data_s

    def bottleneck(self) -> str:
        """The largest part of the step: compute, communication or data. Read ahead, the input path is hidden
        until it is longer than the rest, and then it sets the step: it is compared whole.

        >>> StepPrediction(0.1, 0.2, 0, 0, 0, 0, data_s=0.05, buckets=[], layers=[], input_s=0.35).bottleneck()
        'data loading'
        """
        parts = {"compute": self.compute_s, "communication": self.comm_s,
                 "data loading": max(self.data_s, self.input_s)}
        return max(parts, key=parts.get)


def layer_costs(spec) -> list[LayerCost]:
    """The cost model's view of a described model: GEMMs forward and backward, memory traffic, parameters.

    A layer's backward runs one product per operand that needs a gradient (the
    model description's convention): twice its forward FLOPs is the weight's and
    the input's gradient, once the weight's only (the first layer).

    >>> from gpurig.models import model_spec
    >>> layers = layer_costs(model_spec("mnist-mlp", batch=64))
    >>> layers[0].forward_gemms, layers[0].backward_gemms
    (((64, 1200, 784),), ((1200, 784, 64),))
    """
    out = []
    for layer in spec.layers:
        forward = tuple((g.m, g.n, g.k, g.count) if g.count > 1 else (g.m, g.n, g.k) for g in layer.gemms)
        both = layer.forward_flops and layer.backward_flops >= 1.5 * layer.forward_flops
        backward = tuple(b for g in forward for b in backward_of(g, input_gradient=both)) \
            if layer.backward_flops else ()
        sizes = tuple(math.prod(shape) for _, shape in layer.parameter_shapes)
        largest = max(layer.input_elements, layer.output_elements) // max(layer.calls, 1)
        winograd = layer.kind == "conv" and bool(layer.gemms) and all(map(winograd_applies, layer.gemms))
        trainable = tuple(math.prod(shape) for _, shape in layer.trainable_shapes)
        out.append(LayerCost(layer.name, layer.parameters, forward, backward, layer.forward_bytes,
                             layer.backward_bytes, sizes, kind=layer.kind, activation_values=largest,
                             trainable_sizes=trainable,
                             input_values=layer.input_elements, output_values=layer.output_elements,
                             forward_vector_bytes=layer.forward_vector_bytes,
                             backward_vector_bytes=layer.backward_vector_bytes,
                             forward_float32_bytes=layer.forward_float32_bytes,
                             backward_float32_bytes=layer.backward_float32_bytes, winograd=winograd,
                             batch_norm=layer.batch_norm))
    return out


def winograd_applies(gemm) -> bool:
    """Whether cuDNN can run a convolution (its :class:`~gpurig.models.ops.Gemm`) with Winograd's kernels: dense
    (one group) 3×3 of stride 1 (cuDNN's developer guide, ``CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD`` and
    ``_WINOGRAD_NONFUSED``: 3×3 filters, unit stride). Not priced: the non-fused algorithm's 5×5 filters in FP32
    (AlexNet's second convolution runs as a GEMM here, so is priced slow, if cuDNN picks it). 1×1 convolutions
    are plain GEMMs; strided and grouped ones use implicit GEMM.

    >>> from gpurig.models.ops import Gemm
    >>> [winograd_applies(Gemm(100, 64, 576, 1, k, s)) for k, s in (((3, 3), (1, 1)), ((3, 3), (2, 2)), ((1, 1), (1, 1)))]
    [True, False, False]
    >>> winograd_applies(Gemm(100, 4, 36, 32, (3, 3), (1, 1)))     # ResNeXt's grouped 3×3
    False
    """
    return gemm.count == 1 and tuple(gemm.kernel) == (3, 3) and tuple(gemm.stride) == (1, 1)


def straggler_seconds(compute_s: float, jitter: float, ranks: int) -> float:
    """Expected wait for the slowest of ``ranks`` ranks whose compute varies by ``jitter`` (its coefficient of variation).

    A synchronous step ends when the slowest rank is done: for P normally
    distributed times that is about σ·sqrt(2 ln P) past the mean.

    >>> round(straggler_seconds(0.1, 0.03, 128) * 1000, 2), straggler_seconds(0.1, 0.03, 1)
    (9.35, 0.0)
    """
    return jitter * compute_s * math.sqrt(2 * math.log(ranks)) if ranks > 1 else 0.0


def layer_seconds(layer: LayerCost, device: Device, in_step: bool = True) -> tuple[float, float]:
    """(forward, backward) seconds of one layer on ``device``: in a training step, or (``in_step=False``) as
    bench times it, repeated with its weights in a CPU's cache.

    >>> d = Device("d", GemmModel(0, 1e9, 1e12), 1e12)
    >>> fc = LayerCost("fc", 10, ((10, 10, 10),), tuple(backward_of((10, 10, 10))))
    >>> layer_seconds(fc, d, in_step=False)
    (2e-06, 4e-06)
    >>> big = LayerCost("fc", 1_000_000, ((10, 10, 10),), tuple(backward_of((10, 10, 10))))
    >>> layer_seconds(big, d)     # in a step, forward reads 4 MB of weights from memory at 1 TB/s: 4 µs more
    (6e-06, 4e-06)
    """
    gemm, size = device.gemm_for(layer), device.element_bytes
    # a grouped convolution's groups are ``groups`` GEMMs of their own channels (its products' batch), each in
    # whole tiles: cuDNN's grouped kernels do not pack 4-32 channels a group into one dense GEMM's tiles
    products = (layer.forward_gemms, layer.backward_gemms)
    working_set = 2 * layer.activation_values * size if layer.activation_values else math.inf
    streams = (_stream(layer.forward_bytes, layer.forward_float32_bytes, layer.forward_vector_bytes, size),
               _stream(layer.backward_bytes, layer.backward_float32_bytes, layer.backward_vector_bytes, size))
    slower = nchw_batch_norm_scale(layer.params // 2, device.nchw_batch_norm_units) \
        if layer.batch_norm and device.nchw_batch_norm_units else 1.0
    per_cycle = CUDNN_NHWC_BATCH_NORM_BYTES_PER_SM_CYCLE if device.cudnn_nhwc_batch_norm \
        else BATCH_NORM_BYTES_PER_SM_CYCLE
    sm_bound = per_cycle * device.sm_cycles_per_s if layer.batch_norm else 0.0
    direct = depthwise_seconds(layer, device.sm_cycles_per_s)
    forward, backward = ((direct[k] if direct else sum(gemm.seconds(*g, dtype_bytes=size) for g in gemms))
                         + slower * max(device.stream_seconds(moved, working_set, vector),
                                        moved / sm_bound if sm_bound else 0.0)
                         for k, (gemms, (moved, vector)) in enumerate(zip(products, streams)))
    if layer.kind == "conv" and device.conv_transposes and not direct:  # PyTorch's depthwise kernels take NCHW
        # read and write the input and the output once more each (forward), their gradients in backward (twice
        # forward's, as a copy's backward: :data:`gpurig.models.ops.BACKWARD_TRAFFIC`)
        transposed = device.conv_transposes * 2 * (layer.input_values + layer.output_values) * size
        forward += device.stream_seconds(transposed, working_set, (0.0, 0.0))
        backward += device.stream_seconds(2 * transposed, working_set, (0.0, 0.0))
    if device.cast_bytes_per_param:
        cast = memory_seconds(layer.params * device.cast_bytes_per_param, device.memory_bytes_per_s)
        forward, backward = forward + cast, backward + cast
    # the fixed cost is measured per layer for forward and backward together: a third of it is forward's
    fixed_forward, fixed_backward = device.layer_overhead_s / 3, 2 * device.layer_overhead_s / 3
    if device.is_gpu:  # the host queues kernels while the GPU runs earlier ones: the longer of the two counts
        forward, backward = max(forward, fixed_forward), max(backward, fixed_backward)
    else:
        forward, backward = forward + fixed_forward, backward + fixed_backward
    # Real layers are not their GEMMs and bytes (oneDNN's direct convolutions, cuDNN's Winograd, autograd's
    # transposed operands, pooling's index bookkeeping): bench measures how far they are on this device.
    scale_forward, scale_backward = device.layer_scale(layer)
    # A step streams the whole model's weights, gradients and optimizer state between one forward of a layer
    # and the next, so on a CPU forward reads the weights from memory (the MNIST MLP's forward at 32 per rank
    # runs 0.5 ms of its 2 ms longer with the cache flushed). A GPU's bench layers already outgrow its cache.
    cold = memory_seconds(layer.params * DTYPE_BYTES, device.memory_bytes_per_s) \
        if in_step and not device.is_gpu else 0.0
    return scale_forward * forward + cold, scale_backward * backward


# Batch norm on a GPU: bytes its kernels move per SM per cycle, at most. Its reductions keep the SMs, not the
# memory, busy: on an H100 and an H200 (the same 132 SMs at 1.98 GHz, 3.35 against 4.8 TB/s) the same nets' batch
# norm took 1.03-1.12x as long, their elementwise kernels 1.2-1.4x (`gpu_kernels.py --by-class`, docs/gpu/
# h100-2026-11-27c/kernels/, h200-2026-11-27/third/, fourth/). 6.96: the geometric mean of ResNet-50's rates on both
# GPUs (the bytes the model counts over the measured time), cuDNN's FP32 NCHW kernels and PyTorch's channels-last
# ones (1.58-2.11 TB/s). PyTorch's bf16 NCHW kernels run slower still (:func:`nchw_batch_norm_scale`, on top).
BATCH_NORM_BYTES_PER_SM_CYCLE = 6.96
# cuDNN's NHWC kernels (`batchnorm_*_nhwc_semiPersist`, which PyTorch calls for FP16 on channels-last tensors) go
# faster: ResNet-50's batch norm on an H100 4.33 ms at 64 and 8.62 at 128 in fp16, against 7.21 and 14.06 in bf16
# (PyTorch's channels-last kernels; docs/gpu/h100-2026-11-27c/kernels3/): 2.63 TB/s, 10.05 bytes per SM cycle.
CUDNN_NHWC_BATCH_NORM_BYTES_PER_SM_CYCLE = 10.05
# PyTorch's direct depthwise convolutions (one channel a group: cuDNN is not asked for them), in any precision on the
# CUDA cores: per SM per cycle, values of input and output handled and multiply-adds' FLOPs done, forward and
# backward together; backward takes 4.5 of the 5.5 parts. Measured on an H100 (docs/gpu/h100-2026-11-27c/
# kernels2/): MobileNetV2 at 128 16.35 ms of `conv_depthwise2d_*` kernels in FP32, 16.21 in bf16; EfficientNet-B0
# at 64 10.87 ms (3×3 and 5×5); backward 4.5x and 4.8x forward. The two constants solve those two nets exactly (both
# held-out nets: for them the step, not this part, is the check); the same MobileNetV2 kernels took the same time
# on an H200 (its convolution class 17.87 against 17.99 ms).
DEPTHWISE_VALUES_PER_SM_CYCLE = 0.3464
DEPTHWISE_FLOPS_PER_SM_CYCLE = 2.576
DEPTHWISE_BACKWARD_SHARE = 4.5 / 5.5
# the filters measured, 3×3 and 5×5 (taps a value): PyTorch's direct kernels are specialised for these; a 7×7
# (ConvNeXt's) may run cuDNN's or the generic kernel, not measured, and keeps the GEMM price
DEPTHWISE_KERNELS = (9, 25)


def depthwise_seconds(layer: LayerCost, sm_cycles_per_s: float) -> tuple[float, float] | None:
    """(forward, backward) seconds of a depthwise convolution's direct kernels on a GPU of ``sm_cycles_per_s``
    (SMs × clock), or None for any other layer (or where the SMs are unknown).

    >>> dw = LayerCost("dw", 288, ((6272, 1, 9, 96),), kind="conv", input_values=2408448, output_values=602112)
    >>> [round(t * 1e6, 1) for t in depthwise_seconds(dw, 132 * 1.98e9)]
    [9.0, 40.4]
    >>> depthwise_seconds(LayerCost("c", 288, ((6272, 3, 9, 32),), kind="conv"), 1e12) is None   # 3 channels a group
    True
    >>> depthwise_seconds(LayerCost("c", 4704, ((6272, 1, 49, 96),), kind="conv"), 1e12) is None  # 7×7: not measured
    True
    """
    one_channel = [len(g) > 3 and g[3] > 1 and g[1] == 1 and g[2] in DEPTHWISE_KERNELS for g in layer.forward_gemms]
    if not sm_cycles_per_s or layer.kind != "conv" or not one_channel or not all(one_channel):
        return None
    flops = sum(2 * g[0] * g[1] * g[2] * g[3] for g in layer.forward_gemms)
    total = ((layer.input_values + layer.output_values) / DEPTHWISE_VALUES_PER_SM_CYCLE
             + flops / DEPTHWISE_FLOPS_PER_SM_CYCLE) / sm_cycles_per_s
    return total * (1 - DEPTHWISE_BACKWARD_SHARE), total * DEPTHWISE_BACKWARD_SHARE


# PyTorch's NCHW batch-norm kernels (bf16: cuDNN's take FP32 and FP16 only) run a block per channel for the
# statistics (one pass over the input) and for backward (five passes), 6 of batch norm's 8 passes
# (:data:`gpurig.models.ops.BACKWARD_TRAFFIC`); the transform (2) spreads over the GPU. About
# ``NCHW_NORM_BLOCKS_PER_SM`` of those blocks run on an SM at once, and it takes ``NCHW_NORM_BLOCKS_TO_STREAM``
# per SM to draw the bandwidth the channels-last kernels draw. Measured on an H200 (`gpu_kernels.py --by-class`,
# docs/gpu/h200-2026-11-27/third/, fourth/): ResNet-18 at 128, 11.96 ms of batch norm on NCHW tensors against 3.23
# channels-last, sets the second; 2 a SM (of 1, 2, 4 tried) the first; then ResNet-50 at 64 comes out 14.8 ms (14.5
# measured), MobileNetV2 at 128 33.5 (31.6) and DenseNet-121 at 64 21.1 (20.7); docs/predict.md.
NCHW_NORM_BLOCKS_PER_SM = 2
NCHW_NORM_BLOCKS_TO_STREAM = 3.07
NCHW_NORM_PER_CHANNEL_PASSES, NCHW_NORM_PASSES = 6, 8


def nchw_batch_norm_scale(channels: int, units: int) -> float:
    """How many times its channels-last time a batch norm of ``channels`` channels takes on NCHW tensors on PyTorch's
    own kernels, on a GPU of ``units`` SMs: few channels leave SMs idle; many run in waves of blocks each below the
    bandwidth's share (``channels`` 0, unknown: as many as fill the GPU).

    >>> [round(nchw_batch_norm_scale(c, 132), 2) for c in (64, 256, 2048, 0)]
    [5.0, 1.44, 1.44, 1.4]
    """
    slots = NCHW_NORM_BLOCKS_PER_SM * units
    channels = channels or 64 * slots
    per_channel = max(1.0, math.ceil(channels / slots) * NCHW_NORM_BLOCKS_TO_STREAM * units / channels)
    spread = NCHW_NORM_PASSES - NCHW_NORM_PER_CHANNEL_PASSES
    return (spread + NCHW_NORM_PER_CHANNEL_PASSES * per_channel) / NCHW_NORM_PASSES


def _stream(traced: float, float32: float, vector: float, size: int) -> tuple[float, tuple[float, float]]:
    """The bytes a layer's work outside GEMMs moves with activations of ``size`` bytes, from its ``traced`` float32
    bytes (of which ``float32`` stay 4 bytes a value: autocast runs those operators in float32), and the (bytes,
    values) of its vector-bound part (``vector`` traced bytes, 4 a value as traced).

    >>> _stream(1000, 0, 400, 4), _stream(1000, 200, 400, 2)
    ((1000.0, (400.0, 100.0)), (600.0, (200.0, 100.0)))
    """
    moved = (traced - float32) * size / DTYPE_BYTES + float32
    return moved, (vector * size / DTYPE_BYTES, vector / DTYPE_BYTES)


def _each_layer_seconds(layers: list[LayerCost], device: Device) -> list[tuple[float, float]]:
    """:func:`layer_seconds` of every layer, each distinct layer priced once (a transformer's blocks are
    the same layers over and over: BERT-base's twelve, Transformer-XL's sixteen or eighteen)."""
    seen: dict = {}
    out = []
    for layer in layers:
        key = (layer.params, layer.forward_gemms, layer.backward_gemms, layer.forward_bytes, layer.backward_bytes,
               layer.kind, layer.activation_values, layer.input_values, layer.output_values, layer.forward_vector_bytes, layer.backward_vector_bytes,
               layer.forward_float32_bytes, layer.backward_float32_bytes, layer.winograd, layer.batch_norm)
        if key not in seen:
            seen[key] = layer_seconds(layer, device)
        out.append(seen[key])
    return out


def transfer_seconds(nbytes: float, topology: Topology, algorithm: str = "best",
                     collectives: int = 1) -> tuple[str, float]:
    """(algorithm, seconds) to average a bucket that a ring allreduce of ``nbytes`` would carry, in
    ``collectives`` collectives one after another (PowerSGD's two: each more adds a latency).

    >>> from gpurig.perf.collectives import Link
    >>> t = Topology(1, 2, local=Link(1e-4, 1e9), network=Link(1e-4, 1e9))
    >>> [(a, round(s * 1e3, 2)) for a, s in (transfer_seconds(1e6, t, "ring"), transfer_seconds(1e6, t, "ring", 2))]
    [('ring', 1.2), ('ring', 1.3)]
    """
    if algorithm == "best":
        algorithm, seconds = best_allreduce(nbytes, topology)
    else:
        seconds = allreduce_seconds(nbytes, topology, algorithm)
    return algorithm, seconds + (collectives - 1) * topology.slowest().latency_s


def predict_step(layers: list[LayerCost], device: Device, setup: DataParallelSetup) -> StepPrediction:
    """Predict one data-parallel training step of ``layers`` (forward order) on ``device`` with ``setup``.

    On a GPU each layer takes the longer of its kernels and its fixed cost (the host queues kernels while the GPU
    runs earlier ones), and with ``setup.host_ops`` (the step's operators, traced) a phase takes at least its
    host's launches: every operator at the per-layer fixed cost over :data:`OPS_PER_MEASURED_LAYER`. A model of
    many small operators a layer (autocast's casts, unfused norms) is the host's, however fast its GPU.
    """
    per_layer = _each_layer_seconds(layers, device)
    forward = sum(f for f, _ in per_layer)
    backward = sum(b for _, b in per_layer)
    host = 0.0
    if device.is_gpu and setup.host_ops:
        per_op = device.layer_overhead_s / OPS_PER_MEASURED_LAYER
        host = sum(setup.host_ops) * per_op
        launched = setup.host_ops[1] * per_op
        if backward > 0 and launched > backward:  # the layers' backward stretches with the host's: buckets leave later
            per_layer = [(f, b * launched / backward) for f, b in per_layer]
        forward, backward = max(forward, setup.host_ops[0] * per_op), max(backward, launched)
    params = sum(sum(layer.gradients()) for layer in layers)   # what the optimizer updates and the ranks average
    sharded = setup.shard != "none" and setup.ranks > 1
    if sharded:   # each rank updates its share of the flat buffers
        optimizer = device.optimizer_seconds(setup.optimizer, math.ceil(params / setup.ranks), None,
                                             setup.optimizer_impl)
    else:
        sizes = [size for layer in layers for size in layer.gradients() if size]
        optimizer = device.optimizer_seconds(setup.optimizer, params, sizes, setup.optimizer_impl)

    buckets: list[dict] = []
    comm_total = exposed = codec = 0.0
    if setup.ranks > 1 and params:
        # Copying gradients into the buckets and scaling them: two passes over them per step.
        optimizer += memory_seconds(2 * 2 * params * DTYPE_BYTES, device.memory_bytes_per_s)
        owners = [(i, size) for i, layer in enumerate(layers) for size in layer.gradients()]
        bucket_of = list(setup.bucket_of_tensor) or [0] * len(owners)
        count = max(bucket_of) + 1
        # A bucket leaves when backward has finished the first layer (in forward order) it holds a tensor of.
        done_at, elapsed = [0.0] * len(layers), 0.0
        for i in reversed(range(len(layers))):
            elapsed += per_layer[i][1]
            done_at[i] = elapsed
        ready = [max(done_at[i] for (i, _), b in zip(owners, bucket_of) if b == bucket) for bucket in range(count)]
        leads = [backward - t for t in ready]
        transfers, codecs = [], []
        for b in range(count):
            values = sum(size for (_, size), owner in zip(owners, bucket_of) if owner == b)
            nbytes = setup.bucket_payload_bytes[b] if setup.bucket_payload_bytes else values * DTYPE_BYTES
            algorithm, seconds = transfer_seconds(nbytes, setup.topology, setup.algorithm,
                                                  setup.collectives_per_bucket)
            if setup.bucket_seconds:
                algorithm, seconds = "measured", setup.bucket_seconds[b]
            codec_b = setup.bucket_codec_s[b] if setup.bucket_codec_s else 0.0
            transfers.append(seconds)
            codecs.append(codec_b)
            buckets.append({"values": values, "wire_bytes": nbytes, "algorithm": algorithm, "seconds": seconds,
                            "lead_s": leads[b], "codec_s": codec_b})
        posted = [setup.posted_s] * count
        if setup.bucket_posted_s and not device.is_gpu:
            # A compressed bucket begun under backward costs it bench's measured posting: its fixed part (the
            # hand-offs) whole, what its size adds for the share of its chain that runs beside backward (the
            # rest follows backward's end, as the chain it is); its codec's arithmetic is in that share.
            shares = [min(1.0, lead / (t + c)) if t + c > 0 else 1.0 for lead, t, c in zip(leads, transfers, codecs)]
            posted = [fixed + share * sized for share, (fixed, sized) in zip(shares, setup.bucket_posted_s)]
            codecs = [(1.0 - share) * c for share, c in zip(shares, codecs)]
            for bucket, c in zip(buckets, codecs):
                bucket["codec_s"] = c
        comm_total, codec = sum(transfers), sum(codecs)
        # Sharded, a bucket's ring allreduce becomes its two halves, the same bytes: the reduce-scatter under
        # backward, the parameters' allgather after the step, where nothing hides it.
        gathered = sum(transfers) / 2 if sharded else 0.0
        under_backward = [t / 2 for t in transfers] if sharded else transfers
        exposed, stretch = overlap.timeline(leads, under_backward, codecs, codec_on_cores=not device.is_gpu,
                                            slowdown=setup.compute_slowdown, posted_s=posted)
        exposed += gathered
        backward += stretch
        if not device.is_gpu:
            exposed -= codec  # codec arithmetic on the cores is compute time, reported with backward

    copy = setup.input_bytes / setup.host_to_device_bytes_per_s if setup.host_to_device_bytes_per_s else 0.0
    data = input_seconds(setup.load_seconds, copy, forward + backward + optimizer + exposed, setup.prefetch,
                         setup.pinned)
    backward += codec if not device.is_gpu else 0.0
    return StepPrediction(
        forward_s=forward, backward_s=backward, optimizer_s=optimizer,
        comm_total_s=comm_total, comm_s=max(0.0, exposed), codec_s=codec, data_s=data, buckets=buckets,
        layers=[{"name": layer.name, "forward_s": f, "backward_s": b, "params": layer.params}
                for layer, (f, b) in zip(layers, per_layer)],
        wait_s=straggler_seconds(forward + backward + optimizer, device.jitter, setup.ranks),
        input_s=max(setup.load_seconds, copy) if setup.prefetch else setup.load_seconds + copy, host_s=host)


def speedup_curve(step_for, ranks: list[int], batch_scaling: str = "weak") -> list[dict]:
    """Speed-up and scaling efficiency for each rank count, from ``step_for(ranks)`` (a StepPrediction).

    Weak scaling (the per-rank batch fixed, the usual data-parallel case):
    throughput ∝ ranks / step time; speed-up is against one rank.

    >>> fake = lambda n: StepPrediction(1.0, 0, 0, 0, 0.1 * (n - 1), 0, 0, [], [])
    >>> [round(r["speedup"], 2) for r in speedup_curve(fake, [1, 2, 4])]
    [1.0, 1.82, 3.08]
    """
    base = step_for(1).step_s
    rows = []
    for n in ranks:
        step = step_for(n)
        speed = n * base / step.step_s if batch_scaling == "weak" else base / step.step_s
        rows.append({"ranks": n, "step_s": step.step_s, "speedup": speed, "efficiency": speed / n,
                     "bottleneck": step.bottleneck()})
    return rows
