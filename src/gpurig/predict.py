"""``gpurig predict``: how fast a model will train on N GPUs and M nodes, and why — before running it.

Three inputs, each the one description the rest of gpurig shares:

- the model, as a :class:`~gpurig.spec.model.ModelSpec` (a preset or any
  ``module:factory``, described on the meta device);
- the hardware: a cluster spec (``gpurig doctor --write-spec``, or a one-line
  catalog description) for catalog GPUs and networks, and/or a machine profile
  (``gpurig bench``) for what this machine measured;
- how it runs: per-GPU batch, data / model / hybrid parallelism, compression.

The answer comes from :mod:`gpurig.perf`: the step split into compute (per
layer), communication not hidden under backward, codec work and data loading;
speed-up and scaling efficiency for 1..N GPUs; the bottleneck; advice.

>>> result = predict(PredictRequest(model="mnist-mlp", cluster="2 nodes x 1 RTX 2080 Ti, 1 Gbit/s Ethernet"))
>>> result["bottleneck"]
'communication'
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.perf import codec as codec_cost
from gpurig.perf import machine
from gpurig.perf.collectives import Topology
from gpurig.perf.step import (DataParallelSetup, Device, LayerCost, StepPrediction, layer_costs, predict_step,
                              transfer_seconds)

PARALLEL = ("data", "model", "hybrid")
PARALLEL_WHY = {
    "data": "each GPU its part of the batch; every gradient averaged over the network",
    "model": "the fully connected layers split: their activations travel instead of their gradients, "
             "but every GPU computes the rest on the whole batch",
    "hybrid": "Krizhevsky's scheme: convolutions data-parallel, fully connected layers split on the gathered batch",
}
DEFAULT_BATCH = {"mnist-mlp": 64, "mnist-cnn": 64, "mnist-wide-cnn": 64}  # per GPU; else the source's 64-per-GPU rule of thumb


@dataclass(frozen=True)
class PredictRequest:
    """What to predict (the CLI flags, one to one)."""

    model: str
    cluster: str | None = None       # a cluster spec (.toml), a machine profile (.json) or a one-line description
    profile: str | None = None       # a machine profile to calibrate a spec's devices and links with
    batch: int | None = None         # per GPU
    tokens: int | None = None
    sample: str | None = None
    parallel: str = "data"
    compression: str = "none"
    precision: str = "fp32"
    engine: str = "mpi"              # which engine's measurements a profile's links come from
    gpus: int | None = None          # predict up to this many (default: the whole cluster)
    algorithm: str = "best"
    bucket_mb: float | None = None
    optimizer: str = "momentum"
    prefetch: bool = True
    pinned: bool = True
    network_efficiency: float | None = None  # of the network's data rate; default by kind (docs/predict.md)


# -- the model -----------------------------------------------------------------------------------------

def bucket_of_tensors(spec, cap_mb: float, first_mb: float = 1.0) -> tuple[int, ...]:
    """Each parameter tensor's bucket, as gpurig's DataParallel (and DDP) would fill them.

    >>> from gpurig.zoo import model_spec
    >>> bucket_of_tensors(model_spec("mnist-mlp"), cap_mb=4)
    (1, 1, 0, 0, 0, 0)
    """
    import torch

    from gpurig.parallel.data_parallel import assign_buckets

    tensors = [torch.empty(shape, device="meta") for layer in spec.layers for _, shape in layer.parameter_shapes]
    bucket_of = [0] * len(tensors)
    for b, indices in enumerate(assign_buckets(tensors, int(cap_mb * 2**20), int(first_mb * 2**20))):
        for i in indices:
            bucket_of[i] = b
    return tuple(bucket_of)


# -- the hardware ----------------------------------------------------------------------------------------

@dataclass
class Hardware:
    """Where the prediction runs: devices per rank count, the links, and how many GPUs there are."""

    name: str
    max_ranks: int
    ranks_per_node: int
    device_for: object     # ranks on a node -> Device
    topology_for: object   # ranks -> Topology
    host_to_device_bytes_per_s: float | None
    disk_bytes_per_s: float | None
    source: str
    compute_slowdown: float = 1.0   # while a collective is in flight (bench's overlap measurement)
    posted_s: float = 0.0           # what posting a collective costs the computation (bench's overlap too)
    # codec -> (alpha s, s per gradient byte, s per matrix beyond a bucket's first): bench's timed chain
    compressed: dict = field(default_factory=dict)


def load_hardware(request: PredictRequest) -> Hardware:
    """The hardware ``request.cluster`` (and ``request.profile``) describe, as the cost model uses it."""
    from gpurig.bench import load_profile
    from gpurig.spec.cluster import load_spec
    from gpurig.spec.describe import parse_description

    cluster, profile_path = request.cluster, request.profile
    if cluster is None and profile_path is None:
        raise UsageError("give --cluster (a spec file, a profile or a description such as "
                         "'2 nodes x 4 RTX 2080 Ti, 40 Gbit/s InfiniBand')")
    spec = profile = None
    if cluster is not None and cluster.endswith(".json"):
        profile_path = cluster
    elif cluster is not None and (cluster.endswith(".toml") or Path(cluster).is_file()):
        spec = load_spec(cluster)
    elif cluster is not None:
        spec = parse_description(cluster)
    if profile_path is not None:
        profile = load_profile(profile_path)

    if spec is not None and spec.nodes[0].gpu is not None:
        gpu = spec.nodes[0].gpu
        per_node = spec.nodes[0].gpus
        base = machine.spec_topology(spec, network_efficiency=request.network_efficiency)
        if profile is not None and profile.get("device") not in (None, "cpu"):
            def device_for(ranks, _p=profile):
                return machine.profile_device(_p, ranks)
        else:
            def device_for(ranks, _g=gpu):
                return machine.gpu_device(_g, request.precision)
        from gpurig.perf.transfer import host_copy_efficiency, pcie_bytes_per_s

        node = spec.nodes[0]
        h2d = pcie_bytes_per_s(node.pcie_gen or gpu.pcie_gen or "3.0", node.pcie_lanes or gpu.pcie_lanes or 16) \
            * host_copy_efficiency(request.pinned)
        disk = _disk_rate(spec, profile)
        return Hardware(spec.name or f"{spec.node_count} × {per_node} {gpu.name}", spec.total_gpus, per_node,
                        device_for, lambda n: _sized(base, n, per_node), h2d, disk,
                        "catalog" + (" + profile" if profile is not None else ""))
    if profile is None:
        raise UsageError("a machine without GPUs needs measurements: run `gpurig bench` and pass its profile "
                         "(--cluster runs/bench/profile.json)")
    comm = profile.get("comm") or {}
    nodes = comm.get("nodes", 1)
    ranks = comm.get("ranks", 1)
    if comm:
        base = machine.profile_topology(profile, _engine_key(profile, request.engine), nodes=nodes)
    else:  # a profile of one rank: nothing to communicate with
        from gpurig.perf.collectives import Link

        base = Topology(1, 1, Link(0.0, float("inf")), Link(0.0, float("inf")))
    per_node = max(1, ranks // nodes)
    # Emulated nodes share one machine's cores: what a rank computes at depends on all ranks on the machine.
    per_machine = comm.get("ranks_per_machine", per_node)
    disk = (profile.get("disk") or {}).get("mb_per_s")
    slowdown, posted, compressed = 1.0, 0.0, {}
    if comm:
        engine = _engine_key(profile, request.engine)
        overlap = (comm.get("overlap") or {}).get(engine) or {}
        slowdown, posted = overlap.get("slowdown", 1.0), overlap.get("posted_s", 0.0)
        compressed = {name.partition(":")[2]: (max(0.0, fit["alpha_s"]), fit["beta_s_per_byte"],
                                               _median([r["per_matrix_s"] for r in fit["rows"] if "per_matrix_s" in r]))
                      for name, fit in comm["engines"][engine].items()
                      if name.startswith("compressed:") and fit.get("beta_s_per_byte", 0) > 0}
    return Hardware(f"{profile.get('cpu') or profile.get('device')} ({profile.get('host', 'this machine')})",
                    ranks, per_node,
                    lambda n, _p=profile: machine.profile_device(_p, min(n * per_machine // per_node, per_machine)),
                    lambda n: _sized(base, n, per_node), None, disk * 1e6 if disk else None, "profile", slowdown,
                    posted, compressed)


def _median(values: list[float]) -> float:
    """The median of ``values``; 0 for none (a profile from before bench timed it).

    >>> _median([3.0, 1.0, 2.0]), _median([])
    (2.0, 0.0)
    """
    return statistics.median(values) if values else 0.0


def _engine_key(profile: dict, engine: str) -> str:
    engines = (profile.get("comm") or {}).get("engines", {})
    if engine in engines:
        return engine
    matches = [name for name in engines if name.startswith(engine)]
    if not matches:
        raise UsageError(f"the profile has no {engine!r} measurements (it has: {', '.join(engines) or 'none'})")
    return matches[0]


def _disk_rate(spec, profile) -> float | None:
    if profile and profile.get("disk"):
        return profile["disk"]["mb_per_s"] * 1e6
    disks = [d for d in spec.nodes[0].disks if d.read_mb_s]
    return disks[0].read_mb_s * 1e6 if disks else None


def _sized(base: Topology, ranks: int, per_node: int) -> Topology:
    """The topology of ``ranks`` GPUs filling nodes of ``per_node`` first."""
    if ranks <= per_node:
        return replace(base, nodes=1, gpus_per_node=ranks)
    return replace(base, nodes=math.ceil(ranks / per_node), gpus_per_node=per_node)


# -- one configuration ---------------------------------------------------------------------------------------

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
    shapes = [shape for layer in spec.layers for _, shape in layer.parameter_shapes]
    payload, codec_s = [], []
    # bench times each codec's whole chain on the profile's ranks (PowerSGD at its default rank)
    key = kind if kind != "powersgd" or rank == powersgd.DEFAULT_RANK else method
    measured = key in hardware.compressed and ranks == hardware.max_ranks
    per_bucket = [[s for s, owner in zip(shapes, bucket_of) if owner == b]
                  for b in range(max(bucket_of, default=0) + 1)]
    for mine in per_bucket:
        # the bytes a ring allreduce would carry to send what this method sends: wire × P / 2(P−1)
        payload.append(wire_bytes(method, mine, ranks) * ranks / (2 * (ranks - 1)) if ranks > 1 else 0.0)
        if kind == "powersgd":
            codec_s.append(codec_cost.powersgd_seconds(mine, rank, device.gemm, device.memory_bytes_per_s))
        elif kind != "none":
            encode, decode = device.codec_seconds_per_value.get(kind, (0.0, 0.0))
            codec_s.append(codec_cost.elementwise_seconds(sum(math.prod(s) for s in mine), encode, decode, ranks))
        else:
            codec_s.append(0.0)
    # bench timed this codec's whole chain on these ranks (encode, pieces in flight, decode, with the ranks'
    # synchronisation): each bucket takes what the fit says for its gradient bytes, codec included
    chain = None
    if measured:
        alpha, beta, per_matrix = hardware.compressed[key]
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
    input_bytes = spec.batch * math.prod(spec.sample) * (8 if spec.input_dtype == "int64" else 4)
    load = input_bytes / hardware.disk_bytes_per_s if hardware.disk_bytes_per_s else 0.0
    setup = DataParallelSetup(
        ranks=ranks, topology=topology, algorithm=request.algorithm, bucket_of_tensor=bucket_of,
        bucket_payload_bytes=tuple(payload), bucket_codec_s=tuple(codec_s),
        collectives_per_bucket=collectives, optimizer=request.optimizer,
        compute_slowdown=hardware.compute_slowdown, posted_s=hardware.posted_s, bucket_seconds=chain or (),
        input_bytes=input_bytes if device.is_gpu else 0.0,
        host_to_device_bytes_per_s=hardware.host_to_device_bytes_per_s if device.is_gpu else None,
        load_seconds=load, prefetch=request.prefetch)
    return predict_step(layers, device, setup)


def _check(request: PredictRequest) -> None:
    from gpurig.parallel.compression import parse_method

    if request.parallel not in PARALLEL:
        raise UsageError(f"--parallel must be one of {', '.join(PARALLEL)}, got {request.parallel!r}")
    try:
        parse_method(request.compression)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if request.batch is not None and request.batch < 1:
        raise UsageError(f"--batch must be at least 1 per GPU, got {request.batch}")
    if request.gpus is not None and request.gpus < 1:
        raise UsageError(f"--gpus must be at least 1, got {request.gpus}")
    if request.network_efficiency is not None and not 0 < request.network_efficiency <= 1:
        raise UsageError(f"--network-efficiency must be in (0, 1], got {request.network_efficiency}")


def _step_at(spec, layers, request: PredictRequest, hardware: Hardware, ranks: int) -> StepPrediction:
    topology = hardware.topology_for(ranks)
    device = hardware.device_for(min(ranks, hardware.ranks_per_node))
    if request.parallel != "data" and ranks > 1:
        return split_step(spec, request, device, topology)
    return data_parallel_step(spec, layers, device, topology, request, hardware)


def split_plan(request: PredictRequest, spec) -> tuple[dict[int, str], dict[int, tuple[int, int]], set[int]]:
    """Krizhevsky's plan for the model (:func:`gpurig.krizhevsky_plan`) as layer indices of ``spec``.

    Returns (index → column/row, index → (in, out) features, the column layers fed by the data).

    >>> from gpurig.zoo import model_spec
    >>> split_plan(PredictRequest(model="mnist-mlp"), model_spec("mnist-mlp"))
    ({0: 'column', 2: 'row'}, {0: (784, 1200), 2: (1200, 1200)}, {0})
    """
    from gpurig.parallel.plan import krizhevsky_plan
    from gpurig.zoo import load_factory, preset

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


def split_step(spec, request: PredictRequest, device: Device, topology: Topology) -> StepPrediction:
    """Model or hybrid parallelism of ``spec`` (its batch per rank) over ``topology``'s ranks."""
    from gpurig.perf.model_parallel import predict_split_step
    from gpurig.zoo import model_spec

    ranks = topology.ranks
    plan, widths, fed_by_data = split_plan(request, spec)
    if not plan:
        raise UsageError(f"{spec.name} has no pair of fully connected layers to split: use --parallel data")
    whole = model_spec(request.model, batch=spec.batch * ranks, tokens=request.tokens, sample=request.sample)
    return predict_split_step(layer_costs(whole), layer_costs(spec), plan, widths, device, topology,
                              request.parallel, spec.batch * ranks, fed_by_data, request.optimizer)


def predict(request: PredictRequest) -> dict:
    """Everything ``gpurig predict`` prints: the step split at the largest size, the scaling curve, advice."""
    from gpurig.zoo import model_spec

    _check(request)
    hardware = load_hardware(request)
    top = request.gpus or hardware.max_ranks
    batch = request.batch or DEFAULT_BATCH.get(request.model, 64)
    spec = model_spec(request.model, batch=batch, tokens=request.tokens, sample=request.sample)
    layers = layer_costs(spec)

    counts = sorted({1, *[2**i for i in range(1, 20) if 2**i < top], top})
    single = _step_at(spec, layers, request, hardware, 1).step_s
    curve = []
    for n in counts:
        step = _step_at(spec, layers, request, hardware, n)
        speedup = n * single / step.step_s
        curve.append({"gpus": n, "nodes": hardware.topology_for(n).nodes, "step_ms": 1000 * step.step_s,
                      "speedup": speedup, "efficiency": speedup / n,
                      "bottleneck": step.bottleneck() if n > 1 else "compute"})
    final = _step_at(spec, layers, request, hardware, top)
    result = {
        "model": spec.name, "parameters": spec.parameters, "batch_per_gpu": batch, "gpus": top,
        "nodes": hardware.topology_for(top).nodes, "hardware": hardware.name, "calibration": hardware.source,
        "parallel": request.parallel, "compression": request.compression,
        "step": split_of(final), "bottleneck": final.bottleneck() if top > 1 else "compute",
        "buckets": final.buckets, "layers": final.layers, "scaling": curve,
    }
    result["advice"] = advice(spec, layers, request, hardware, top, final)
    return result


def advice(spec, layers, request: PredictRequest, hardware: Hardware, ranks: int, step: StepPrediction) -> list[dict]:
    """What would make this faster, each item predicted: batch size, compression, a faster network or PCIe."""
    from gpurig.parallel.sharding import tile_advice
    from gpurig.zoo import model_spec

    items = []
    base_rate = ranks * spec.batch / step.step_s

    def gain(other_step: StepPrediction, other_batch: int | None = None) -> float:
        return ranks * (other_batch or spec.batch) / other_step.step_s / base_rate

    rule = tile_advice(spec.batch)
    if rule:
        better = max(64, -(-spec.batch // 64) * 64)
        other = model_spec(request.model, batch=better, tokens=request.tokens, sample=request.sample)
        predicted = _step_at(other, layer_costs(other), request, hardware, ranks)
        items.append({"what": f"per-GPU batch {better}", "why": rule,
                      "samples_per_s_gain": gain(predicted, better)})
    if ranks > 1 and step.bottleneck() == "communication":
        for method in ("fp16", "int8", "powersgd"):
            if method == request.compression:
                continue
            predicted = _step_at(spec, layers, replace(request, compression=method), hardware, ranks)
            items.append({"what": f"--compression {method}", "why": "the network is the bottleneck: "
                          f"{1000 * step.comm_s:.1f} ms of each step wait for gradients",
                          "samples_per_s_gain": gain(predicted)})
        topology = hardware.topology_for(ranks)
        faster = replace(hardware, topology_for=lambda n, _h=hardware: _faster_network(_h.topology_for(n), 10))
        predicted = _step_at(spec, layers, request, faster, ranks)
        tier = "network" if topology.nodes > 1 else "link between GPUs"
        items.append({"what": f"a 10x faster {tier}", "why": "what the link, not the GPU, costs",
                      "samples_per_s_gain": gain(predicted)})
    if ranks > 1:
        for mode in PARALLEL:
            if mode == request.parallel:
                continue
            try:
                predicted = _step_at(spec, layers, replace(request, parallel=mode), hardware, ranks)
            except UsageError:
                break  # nothing to split
            items.append({"what": f"--parallel {mode}", "why": PARALLEL_WHY[mode],
                          "samples_per_s_gain": gain(predicted)})
    if hardware.host_to_device_bytes_per_s and step.data_s > 0.05 * step.step_s:
        items.append({"what": "pinned memory and asynchronous loading", "why": f"{1000 * step.data_s:.1f} ms of "
                      "each step move the batch to the GPU", "samples_per_s_gain": None})
    return items


def _faster_network(topology: Topology, factor: float) -> Topology:
    from gpurig.perf.collectives import Link

    def faster(link):
        return Link(link.latency_s, link.bytes_per_s * factor)

    if topology.nodes > 1:
        return replace(topology, network=faster(topology.network))
    return replace(topology, local=faster(topology.local))


def split_of(step: StepPrediction) -> dict:
    """A predicted step in ``gpurig train``'s terms, milliseconds."""
    return {"step_ms": 1000 * step.step_s, "compute_ms": 1000 * step.compute_s, "forward_ms": 1000 * step.forward_s,
            "backward_ms": 1000 * step.backward_s, "optimizer_ms": 1000 * step.optimizer_s,
            "comm_ms": 1000 * step.comm_s, "wait_ms": 1000 * step.wait_s, "comm_total_ms": 1000 * step.comm_total_s,
            "codec_ms": 1000 * step.codec_s, "data_ms": 1000 * step.data_s}


def predicted_split(model: str, profile_path: str, ranks: int, per_rank_batch: int, compression: str,
                    parallel: str, engine: str) -> dict:
    """What ``gpurig train`` prints next to its measured split: the predicted step for the same configuration.

    >>> predicted_split("mlp", "runs/train/profile.json", 2, 64, "int8", "data", "mpi")["step_ms"]   # doctest: +SKIP
    36.2
    """
    request = PredictRequest(model=f"mnist-{model}", cluster=profile_path, batch=per_rank_batch, gpus=ranks,
                             compression=compression, parallel=parallel, engine=engine)
    return predict(request)["step"]
