"""One configuration's predicted step: data parallelism (buckets, compression, overlap) or model / hybrid
parallelism (Krizhevsky's plan), on a given number of ranks."""

from __future__ import annotations

import functools
import math

from gpurig.errors import UsageError
from gpurig.perf import codec as codec_cost
from gpurig.perf.collectives import Topology
from gpurig.perf.step import (DataParallelSetup, Device, LayerCost, StepPrediction, input_seconds, layer_costs,
                              predict_step, transfer_seconds)
from gpurig.predict.hardware import Hardware
from gpurig.predict.request import PredictRequest, optimizer_impl

def bucket_of_tensors(spec, cap_mb: float, first_mb: float = 1.0) -> tuple[int, ...]:
    """Each trainable parameter tensor's bucket, as gpurig's DataParallel (and DDP) would fill them (a frozen
    tensor has no gradient to average).

    >>> from gpurig.models import model_spec
    >>> bucket_of_tensors(model_spec("mnist-mlp"), cap_mb=4)
    (1, 1, 0, 0, 0, 0)
    """
    shapes = tuple(tuple(shape) for layer in spec.layers for _, shape in layer.trainable_shapes)
    return _bucket_of_shapes(shapes, int(cap_mb * 2**20), int(first_mb * 2**20))


@functools.lru_cache(maxsize=256)
def _bucket_of_shapes(shapes: tuple, cap_bytes: int, first_bytes: int) -> tuple[int, ...]:
    import torch

    from gpurig.parallel.data_parallel import assign_buckets

    tensors = [torch.empty(shape, device="meta") for shape in shapes]
    bucket_of = [0] * len(tensors)
    for b, indices in enumerate(assign_buckets(tensors, cap_bytes, first_bytes)):
        for i in indices:
            bucket_of[i] = b
    return tuple(bucket_of)


def data_parallel_step(spec, layers: list[LayerCost], device: Device, topology: Topology, request: PredictRequest,
                       hardware: Hardware) -> StepPrediction:
    """Predict one data-parallel step of ``spec`` (at its batch per rank) on ``topology``'s ranks."""
    from gpurig.parallel import powersgd
    from gpurig.parallel.compression import parse_method, wire_bytes

    ranks = topology.ranks
    method = request.compression
    kind, rank = parse_method(method)
    collectives = 1 if kind == "none" else 2   # a compressed bucket: two (an exchange and a gather, or P and Q)
    cap = request.bucket_mb or (25.0 if method == "none" else 4.0)
    bucket_of = bucket_of_tensors(spec, cap)
    shapes = [shape for layer in spec.layers for _, shape in layer.trainable_shapes]
    payload, codec_s = [], []
    # bench times each codec's whole chain on the profile's ranks (PowerSGD at its default rank)
    key = kind if kind != "powersgd" or rank == powersgd.DEFAULT_RANK else method
    measured = key in hardware.compressed and ranks == hardware.max_ranks
    per_bucket = [[] for _ in range(max(bucket_of, default=0) + 1)]
    for shape, owner in zip(shapes, bucket_of):
        per_bucket[owner].append(shape)
    for mine in per_bucket:
        # the bytes a ring allreduce would carry to send what this method sends: wire × P / 2(P−1)
        payload.append(wire_bytes(method, mine, ranks) * ranks / (2 * (ranks - 1)) if ranks > 1 else 0.0)
        if kind == "powersgd":
            matrices, _ = powersgd.split(mine, rank)
            codec_s.append(codec_cost.powersgd_seconds(matrices, rank, device.gemm, device.memory_bytes_per_s))
        elif kind != "none":
            encode, decode = device.codec_seconds_per_value.get(kind, (0.0, 0.0))
            codec_s.append(codec_cost.elementwise_seconds(sum(math.prod(s) for s in mine), encode, decode, ranks))
        else:
            codec_s.append(0.0)
    # bench timed this codec's whole chain on these ranks (encode, pieces in flight, decode, with the ranks'
    # synchronisation): each bucket takes what the fit says for its gradient bytes, codec included
    chain = posted = None
    if measured:
        alpha, beta, per_matrix, posting = hardware.compressed[key]
        # PowerSGD works matrix by matrix: bench timed one matrix per bucket, and what each one more adds
        more = [max(0, len(powersgd.split(mine, rank)[0]) - 1) if kind == "powersgd" else 0 for mine in per_bucket]
        chain = tuple(alpha + beta * 4 * sum(math.prod(s) for s in mine) + extra * per_matrix
                      for mine, extra in zip(per_bucket, more))
        if device.is_gpu:
            codec_s = [0.0] * len(chain)  # the codec's kernels are in the chain, beside backward's on the SMs
        else:
            # On CPU ranks the chain's arithmetic runs on the cores backward needs: it cannot hide under
            # backward (PowerSGD's products were predicted 4-10 % short when it did); only the rest can.
            # (each matrix's own steps, the QR and the small products, are work on the cores too)
            # The model's arithmetic is an estimate, the chain a measurement: what is left of the chain for the
            # link is at least the compressed bytes' time on it (PowerSGD's factors behind 100 Mbit/s were
            # predicted to travel in 0.1 ms when the arithmetic estimate exceeded the chain).
            wire = [transfer_seconds(nbytes, topology, request.algorithm, collectives)[1] if ranks > 1 else 0.0
                    for nbytes in payload]
            codec_s = [max(0.0, min(c + m * per_matrix, whole - floor))
                       for c, m, whole, floor in zip(codec_s, more, chain, wire)]
            chain = tuple(whole - c for c, whole in zip(codec_s, chain))
            if posting:  # bench timed what posting such a bucket costs backward: its chain's work beside it
                posted = tuple((posting[0], posting[1] * 4 * sum(math.prod(s) for s in mine)) for mine in per_bucket)
    host_ops = step_operators(request) if device.is_gpu else ()
    input_bytes = spec.batch * math.prod(spec.sample) * (8 if spec.input_dtype == "int64" else 4)
    load = input_bytes / hardware.disk_bytes_per_s if hardware.disk_bytes_per_s else 0.0
    setup = DataParallelSetup(
        ranks=ranks, topology=topology, algorithm=request.algorithm, bucket_of_tensor=bucket_of,
        bucket_payload_bytes=tuple(payload), bucket_codec_s=tuple(codec_s),
        collectives_per_bucket=collectives, optimizer=request.optimizer,
        optimizer_impl=optimizer_impl(request, device.is_gpu), shard=request.shard,
        compute_slowdown=hardware.compute_slowdown, posted_s=hardware.posted_s, bucket_seconds=chain or (),
        bucket_posted_s=posted or (),
        input_bytes=input_bytes if device.is_gpu else 0.0,
        host_to_device_bytes_per_s=hardware.host_to_device_bytes_per_s if device.is_gpu else None,
        load_seconds=load, prefetch=request.prefetch, pinned=request.pinned, host_ops=host_ops)
    return predict_step(layers, device, setup)


def step_operators(request: PredictRequest) -> tuple[int, int]:
    """(forward, backward) operators one training step of the request's model dispatches in its precision
    (:func:`gpurig.models.step_operators`); () when the meta device cannot run its backward.

    >>> step_operators(PredictRequest(model="mnist-mlp")), step_operators(PredictRequest(model="mnist-mlp", precision="bf16"))
    ((8, 13), (16, 20))
    """
    from gpurig.models import step_operators as traced
    from gpurig.perf.precision import MIXED

    return traced(request.model, tokens=request.tokens, sample=request.sample,
                  mixed=request.precision in MIXED) or ()


def step_at(spec, layers, request: PredictRequest, hardware: Hardware, ranks: int) -> StepPrediction:
    """The step on ``ranks`` ranks; on a cluster of several GPU models, the slowest rank's (everyone waits for it)."""
    topology = hardware.topology_for(ranks)
    devices = hardware.devices_in_use(ranks) if hardware.devices_in_use else \
        [hardware.device_for(min(ranks, hardware.ranks_per_node))]
    steps = [split_step(spec, request, device, topology, hardware) if request.parallel != "data" and ranks > 1 else
             data_parallel_step(spec, layers, device, topology, request, hardware) for device in devices]
    return max(steps, key=lambda step: step.step_s)


def split_plan(request: PredictRequest, spec) -> tuple[dict[int, str], dict[int, tuple[int, int]], set[int]]:
    """Krizhevsky's plan for the model (:func:`gpurig.krizhevsky_plan`) as layer indices of ``spec``.

    Returns (index → column/row, index → (in, out) features, the column layers fed by the data).

    >>> from gpurig.models import model_spec
    >>> split_plan(PredictRequest(model="mnist-mlp"), model_spec("mnist-mlp"))
    ({0: 'column', 2: 'row'}, {0: (784, 1200), 2: (1200, 1200)}, {0})
    """
    from gpurig.parallel.layer_plan import krizhevsky_plan
    from gpurig.models import load_factory, preset

    module = load_factory(request.model) if ":" in request.model else preset(request.model).build()
    modules = dict(module.named_modules())
    names = {layer.name: i for i, layer in enumerate(spec.layers)}
    plan, widths = {}, {}
    for name, how in krizhevsky_plan(module).items():
        if name in names:
            plan[names[name]] = how
            widths[names[name]] = (modules[name].in_features, modules[name].out_features)
    first_with_weights = next((i for i, layer in enumerate(spec.layers) if layer.parameters), None)
    fed_by_data = {i for i, how in plan.items() if how == "column" and i == first_with_weights}
    return plan, widths, fed_by_data


def split_step(spec, request: PredictRequest, device: Device, topology: Topology,
               hardware: Hardware | None = None) -> StepPrediction:
    """Model or hybrid parallelism of ``spec`` (its batch per rank) over ``topology``'s ranks; each rank's input
    crosses PCIe as in data parallelism (so 1 GPU and N GPUs price the same copy)."""
    from gpurig.perf.model_parallel import predict_split_step
    from gpurig.models import model_spec

    ranks = topology.ranks
    plan, widths, fed_by_data = split_plan(request, spec)
    if not plan:
        raise UsageError(f"{spec.name} has no pair of fully connected layers to split: use --parallel data")
    whole = model_spec(request.model, batch=spec.batch * ranks, tokens=request.tokens, sample=request.sample)
    step = predict_split_step(layer_costs(whole), layer_costs(spec), plan, widths, device, topology,
                              request.parallel, spec.batch * ranks, fed_by_data, request.optimizer,
                              optimizer_impl(request, device.is_gpu))
    if device.is_gpu and hardware is not None and hardware.host_to_device_bytes_per_s:
        # the model mode feeds every rank the whole batch, the hybrid mode its share
        samples = spec.batch * ranks if request.parallel == "model" else spec.batch
        input_bytes = samples * math.prod(spec.sample) * (8 if spec.input_dtype == "int64" else 4)
        step.data_s += input_seconds(0.0, input_bytes / hardware.host_to_device_bytes_per_s, step.compute_s,
                                     request.prefetch, request.pinned)
    return step
