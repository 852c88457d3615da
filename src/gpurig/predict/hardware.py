"""The hardware a prediction runs on: a cluster spec (catalog parts) and/or a machine profile (``gpurig bench``),
turned into what the cost model uses — a device per rank count and the links between the ranks."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpurig.errors import UsageError
from gpurig.perf import machine
from gpurig.perf.collectives import Topology
from gpurig.predict.request import PredictRequest
from gpurig.spec.cluster import too_many_gpus


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
    # codec -> (alpha s, s per gradient byte, s per matrix beyond a bucket's first): bench's timed chain, then
    # what posting a bucket costs the computation (alpha s, s per gradient byte) or None where not measured
    compressed: dict = field(default_factory=dict)
    gpu: object = None              # the catalog GPU, if the hardware is one (its memory, its precisions): the
                                    # smallest of a cluster of several models
    # ranks -> a Device per GPU model those ranks use, when they are several: the slowest sets the step
    devices_in_use: object = None
    # a profile's GPU, found in the catalog by the name bench recorded: its memory, for "will it fit"
    device_memory_gb: float | None = None
    unit: str = "GPU"  # what one rank computes on, as the header names it ("CPU rank" for a CPU profile)
    # every catalog GPU model of the cluster with how many it has, in the spec's order (one entry for most)
    gpu_models: tuple = ()
    note: str = ""     # what the description said that plays no part (a network on one machine)


def one_machine_note(spec) -> str:
    """What to say when a cluster of one machine names a network: nothing crosses it.

    >>> from gpurig.spec.describe import parse_description
    >>> one_machine_note(parse_description("4 RTX 3090, 10 GbE"))
    "one machine: its 4 GPUs talk inside it and the 10 Gigabit Ethernet carries nothing (4 machines of one GPU each: '4 nodes x 1 GeForce RTX 3090, 10 Gigabit Ethernet')"
    >>> one_machine_note(parse_description("2 nodes x 4 RTX 3090, 10 GbE"))
    ''
    """
    if spec.node_count != 1 or spec.network is None:
        return ""
    node, network = spec.nodes[0], spec.network.name
    return (f"one machine: its {node.gpus} GPUs talk inside it and the {network} carries nothing "
            f"({node.gpus} machines of one GPU each: '{node.gpus} nodes x 1 {node.gpu.name}, {network}')")


def too_many_note(spec) -> str:
    """What to say of a machine said to hold more GPUs than any machine does (it is priced as asked).

    >>> from gpurig.spec.describe import parse_description
    >>> too_many_note(parse_description("1000 A100"))
    "no machine holds 1000 GPUs (8 in most servers, 16 in the largest): a cluster is '125 nodes x 8 A100 SXM4 40 GB, NETWORK'; priced as one"
    >>> too_many_note(parse_description("8 A100"))
    ''
    """
    node = max((node for node in spec.nodes if node.gpu is not None), key=lambda node: node.gpus, default=None)
    said = too_many_gpus(node.gpus, f"{node.gpu.name}, NETWORK") if node is not None else ""
    return said + "; priced as one" if said else ""


def load_hardware(request: PredictRequest) -> Hardware:
    """The hardware ``request.cluster`` (and ``request.profile``) describe, as the cost model uses it."""
    from gpurig.measure.profile import load_profile
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
        if request.precision != "fp32":
            raise UsageError(f"--precision {request.precision}: a measured profile prices fp32 (bench timed its "
                             "GEMMs in float32); predict from catalog parts, such as --cluster '1 x A100'")
        if request.software != "current":
            raise UsageError(f"--software {request.software}: a measured profile is timed on the software it ran; "
                             "predict from catalog parts, such as --cluster '1 x A100'")
        timed = {row["optimizer"] for runs in (profile.get("compute") or {}).values()
                 for row in runs.get("optimizers", [])}
        if request.optimizer_impl is not None and request.optimizer in timed:
            raise UsageError(f"--optimizer-impl {request.optimizer_impl}: the profile prices {request.optimizer} as "
                             "bench timed it (torch.optim's default there); leave it out, or predict from catalog "
                             "parts, such as --cluster '1 x A100'")

    if spec is not None and any(node.gpu is not None and node.gpus for node in spec.nodes):
        hardware = _spec_hardware(spec, profile, request)
        hardware.note = "; ".join(filter(None, (one_machine_note(spec), too_many_note(spec))))
        return hardware
    if profile is None:
        raise UsageError("a machine without GPUs needs measurements: run `gpurig bench` and pass its profile "
                         "(--cluster runs/bench/profile.json)")
    where = request.profile or request.cluster
    check_measured(profile, where, "compute")
    comm = profile.get("comm") or {}
    if comm:
        check_measured(comm["engines"][_engine_key(profile, request.engine)], where, "allreduce", "comm")
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
                                               _median([r["per_matrix_s"] for r in fit["rows"] if "per_matrix_s" in r]),
                                               (fit["posted_alpha_s"], fit["posted_beta_s_per_byte"])
                                               if "posted_alpha_s" in fit else None)
                      for name, fit in comm["engines"][engine].items()
                      if name.startswith("compressed:") and fit.get("beta_s_per_byte", 0) > 0}
    catalog, gpu = _catalog_device(profile, request), _profile_gpu(profile)
    measured_on = profile.get("device") if gpu is not None else profile.get("cpu") or profile.get("device")
    return Hardware(f"{measured_on} ({profile.get('host', 'this machine')})",
                    ranks, per_node,
                    lambda n, _p=profile: machine.profile_device(_p, min(n * per_machine // per_node, per_machine),
                                                                 catalog),
                    lambda n: _sized(base, n, per_node), None, disk * 1e6 if disk else None, "profile", slowdown,
                    posted, compressed, device_memory_gb=gpu.memory_gb if gpu is not None else None,
                    unit="GPU" if gpu is not None or "cuda" in str(profile.get("device", "")).lower() else "CPU rank")


def check_measured(measurements: dict, where: str, key: str, part: str | None = None) -> None:
    """Refuse, in one line and before any work, a profile that lacks what the prediction reads: bench was run
    without that part (``--parts comm,p2p`` has no compute; ``--parts p2p`` no allreduce).

    >>> check_measured({"disk": {"mb_per_s": 900}}, "disk.json", "compute")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: disk.json: the profile has no compute measurements: run gpurig bench with the compute part
    """
    if not measurements.get(key):
        raise UsageError(f"{where}: the profile has no {key} measurements: run gpurig bench with the "
                         f"{part or key} part")


def _catalog_device(profile: dict, request: PredictRequest):
    """The catalog's model of the GPU a profile measured (:func:`_profile_gpu`); None for a CPU's profile or a
    GPU the catalog lacks (then bench's GEMMs price every product)."""
    gpu = _profile_gpu(profile)
    return None if gpu is None else _catalog_model(gpu, request)


def _profile_gpu(profile: dict):
    """The catalog's GPU a profile measured, found by the name bench recorded ("NVIDIA H100 80GB HBM3"); None for
    a CPU's profile or a GPU the catalog lacks."""
    from gpurig.spec import catalog
    from gpurig.spec.fields import SpecError

    name = profile.get("device")
    if not name or name == "cpu":
        return None
    try:
        return catalog.gpu(name)
    except SpecError:
        return None


def _check_same_gpu(profile: dict, machines: list, where: str) -> None:
    """Refuse a profile measured on another GPU than the cluster's: bench's numbers calibrate the GPU they timed."""
    found = _profile_gpu(profile)
    measured = found.name if found is not None else None
    wanted = sorted({node.gpu.name for node in machines})
    if measured is None or wanted != [measured]:
        raise UsageError(f"--profile {where}: measured on {profile['device']}, not the cluster's {' and '.join(wanted)}: "
                         "a profile calibrates the GPU it measured (leave --profile out to price the catalog's)")


def _catalog_model(gpu, request: PredictRequest):
    """The catalog's model of ``gpu`` as ``request`` runs it: its precision, software release and memory format."""
    return machine.gpu_device(gpu, request.precision, software=request.software, memory_format=request.memory_format)


def _spec_hardware(spec, profile, request: PredictRequest) -> Hardware:
    """A cluster spec's machines, every ``[[nodes]]`` table: the ranks fill the machines in the spec's order; the
    links are the slowest the ranks cross (sockets, switches: :mod:`gpurig.hardware.topology`), the device the
    slowest GPU's."""
    from gpurig.perf.transfer import host_copy_efficiency

    spec = _as_devices(spec)
    # each [[nodes]] table once, with how many machines it is (a cluster of 100,000 is not a list of 100,000)
    kinds = [node for node in spec.nodes if node.gpu is not None and node.gpus and node.count]
    base = machine.spec_topology(spec, network_efficiency=request.network_efficiency)
    first = kinds[0]
    measured = profile is not None and profile.get("device") not in (None, "cpu")
    if measured:
        check_measured(profile, request.profile or request.cluster, "compute")
        _check_same_gpu(profile, kinds, request.profile or request.cluster)
    count = sum(node.count for node in kinds)
    if spec.network is None and count > 1:   # priced over PCIe it would beat any real network
        raise UsageError(f"--cluster: {count} machines and no network between them: name it, e.g. "
                         "'..., 10 GbE' or '..., InfiniBand HDR' (network = ... in a spec file)")

    def device_of(gpu, ranks):
        catalog = _catalog_model(gpu, request)
        return machine.profile_device(profile, ranks, catalog) if measured else catalog

    def placed(n: int) -> list[tuple]:
        """(node, ranks on each, how many such machines) as ``n`` ranks fill the machines in the spec's order."""
        out, left = [], n
        for node in kinds:
            whole = min(node.count, left // node.gpus)
            if whole:
                out.append((node, node.gpus, whole))
                left -= whole * node.gpus
            if 0 < left and whole < node.count:   # a machine partly used: the ranks end there
                out.append((node, left, 1))
                left = 0
            if left <= 0:
                break
        return out

    def topology_for(n: int) -> Topology:
        used = placed(n)
        local = min((_local_link(node, r) for node, r, _ in used), key=lambda link: link.bytes_per_s)
        nodes = sum(copies for _, _, copies in used)
        return replace(base, nodes=nodes, gpus_per_node=math.ceil(n / nodes), local=local)

    models = {node.gpu.name: node.gpu for node in kinds}
    devices_in_use = None
    if len(models) > 1 and not measured:
        def devices_in_use(n):
            used = {node.gpu.name: node.gpu for node, _, _ in placed(n)}
            return [_catalog_model(gpu, request) for gpu in used.values()]
    h2d = min(_host_copy_rate(node) for node in kinds) * host_copy_efficiency(request.pinned)
    disk = _disk_rate(spec, profile)
    if profile is not None and not measured and not profile.get("disk"):
        raise UsageError(f"--profile {request.profile or request.cluster}: measured on a {profile.get('device') or 'CPU'}, "
                         "with no disk: nothing in it applies to the cluster's catalog GPUs")
    source = "catalog" + (" + profile" if measured else " + profile's disk" if profile is not None else "")
    name = spec.name or " + ".join(f"{node.count} × {node.gpus} {node.gpu.name}" for node in spec.nodes if node.gpu)
    counted: dict = {}
    for node in kinds:
        gpu, had = counted.get(node.gpu.name, (node.gpu, 0))
        counted[node.gpu.name] = (gpu, had + node.gpus * node.count)
    return Hardware(name, spec.total_gpus, first.gpus, lambda ranks: device_of(first.gpu, ranks), topology_for, h2d,
                    disk, source,
                    gpu=min(models.values(), key=lambda gpu: gpu.memory_gb), devices_in_use=devices_in_use,
                    gpu_models=tuple(counted.values()))


def _as_devices(spec):
    """``spec`` as training sees it: a board of two devices (a K80, an MI250) is two GPUs of half its memory,
    compute and host link (:data:`gpurig.spec.hardware.DEVICES_PER_BOARD`).

    >>> from gpurig.spec.describe import parse_description
    >>> node = _as_devices(parse_description("2 x Tesla K80")).nodes[0]
    >>> node.gpus, node.gpu.memory_gb
    (4, 12.0)
    """
    from gpurig.spec.hardware import DEVICES_PER_BOARD, one_device

    if not any(node.gpu is not None and node.gpu.name in DEVICES_PER_BOARD for node in spec.nodes):
        return spec
    nodes = []
    for node in spec.nodes:
        n = DEVICES_PER_BOARD.get(node.gpu.name, 1) if node.gpu is not None else 1
        nodes.append(node if n == 1 else replace(node, gpus=node.gpus * n, gpu=one_device(node.gpu),
                                                 pcie_lanes=max(1, node.pcie_lanes // n) if node.pcie_lanes else None))
    return replace(spec, nodes=tuple(nodes))


def _host_copy_rate(node) -> float:
    """Bytes per second each GPU of ``node`` copies its batch from the host at, all copying at once: its own
    lanes' rate, or its share of the x16 uplink of the PCIe switch it sits behind.

    >>> from gpurig.spec.describe import parse_description
    >>> own, shared = (parse_description(d).nodes[0] for d in ("8 K40, PCIe 3.0 x16", "8 K40, PCIe 3.0 x16, 2 PLX"))
    >>> round(_host_copy_rate(own) / 1e9, 2), round(_host_copy_rate(shared) / 1e9, 2)   # 4 GPUs per switch
    (15.75, 3.94)
    """
    from gpurig.hardware import topology
    from gpurig.perf.transfer import pcie_bytes_per_s

    gen, lanes = pcie_of(node)
    rate = pcie_bytes_per_s(gen, lanes)
    if node.pcie_switches:
        behind = topology.spread(node.gpus, node.pcie_switches)[0]
        rate = min(rate, pcie_bytes_per_s(gen, topology.SWITCH_UPLINK_LANES) / behind)
    return rate


def pcie_of(node) -> tuple[str, int]:
    """The PCIe generation and lanes a node's GPUs run at: the lower of the slot's and the card's (a PCIe 3.0
    card in a 5.0 slot runs at 3.0, an x8 card in an x16 slot at x8); 3.0 x16 where neither says.

    >>> from gpurig.spec.describe import parse_description
    >>> pcie_of(parse_description("4 x RTX 2080 Ti, PCIe 5.0 x16").nodes[0])
    ('3.0', 16)
    """
    from gpurig.perf.transfer import slower_link

    return slower_link((node.pcie_gen, node.gpu.pcie_gen), (node.pcie_lanes, node.gpu.pcie_lanes))


def _local_link(node, ranks: int):
    """The slowest hop a ring over ``ranks`` GPUs of ``node`` crosses, as the cost model prices it."""
    from gpurig.hardware import topology
    from gpurig.hardware.reference import gpu_pcie_link
    from gpurig.perf.collectives import Link

    gpu = node.gpu
    pcie = gpu_pcie_link(*pcie_of(node))
    nvlink = machine.nvlink_ring(gpu, node.gpus, ranks)
    kind = topology.hop(node.gpus, ranks, node.sockets, node.pcie_switches, nvlink)
    if kind == "nvlink":  # the catalog's figure is both directions together: half each way
        return Link(machine.LATENCY_S["nvlink"], gpu.gpu_link_gbs * 1e9 / 2 * machine.LINK_EFFICIENCY)
    return topology.hop_link(kind, pcie)


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
    disks = [d for node in spec.nodes for d in node.disks if d.read_mb_s]
    return min(d.read_mb_s for d in disks) * 1e6 if disks else None


def _sized(base: Topology, ranks: int, per_node: int) -> Topology:
    """The topology of ``ranks`` GPUs filling nodes of ``per_node`` first."""
    if ranks <= per_node:
        return replace(base, nodes=1, gpus_per_node=ranks)
    return replace(base, nodes=math.ceil(ranks / per_node), gpus_per_node=per_node)
