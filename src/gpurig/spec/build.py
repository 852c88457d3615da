"""A parts list for ``gpurig plan``: GPUs, CPU, RAM, PSU, board, storage, and how the machine will be used.

Read from a TOML build file, from flags, or from a cluster spec (what ``gpurig
doctor`` wrote), and checked with the same one-line errors as every spec::

    ram_gb = 64

    [[gpus]]
    model = "RTX 2080 Ti"        # a catalog name (loose: "2080ti" works)
    count = 4
    cooler = "blower"            # optional: blower, open, passive or water (default: the reference card's)

    [cpu]
    cores = 8
    threads = 16
    ghz = 3.5
    tdp_w = 150
    pcie_lanes = 40

    [psu]
    watts = 1600
    efficiency = 0.9             # fraction of wall power that reaches the parts
    pcie_8pin = 8                # PCIe power connectors (an 8-pin is 6+2: it can feed a 6-pin socket)

    [board]
    gpu_slots = 4                # x16-size slots
    slot_pitch = 2               # slots from one GPU slot to the next
    lanes = [16, 8, 8, 8]        # lanes each GPU gets (else split from the CPU's lanes as boards do)
    sockets = 1                  # CPU sockets ([cpu] is one of them: pcie_lanes each)
    pcie_switches = 0            # PCIe switches (PLX) the GPUs sit behind

    [case]
    gpu_length_mm = 320          # the longest card the case takes (full-length cards are up to 312 mm)
    radiators = 2                # 120/240 mm radiator mounts, for water cooling

    [storage]
    ssd_gb = 1000
    hdd_gb = 4000

    [usage]
    preprocessing = "during"     # "during" training (>= 4 CPU threads per GPU) or "before" (>= 2)
    use_case = "research"
    hours = 336
    price_per_kwh = 0.20

A cluster of different machines (a 3 + 1, a 4-GPU box beside a 2-GPU one) is one
parts list per kind of machine: the file above is the first, each
``[[other_nodes]]`` table another, with its own ``[[other_nodes.gpus]]``,
``[other_nodes.psu]``, … and ``[other_nodes.cluster] nodes = N``. ``plan
--spec`` makes the same from a cluster spec's ``[[nodes]]`` tables.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from gpurig.spec.cluster import CPU, ClusterSpec, gpu_from, network_from
from gpurig.spec.fields import SpecError, from_mapping, number, text, unknown_keys, flag
from gpurig.spec.hardware import COOLERS, GPU, PCIE_GENERATIONS, Network
from gpurig.spec.tomlio import read_toml

USE_CASES = {  # GB of GPU memory each use needs (hardware guide)
    "sota-research": 11, "architecture-research": 8, "research": 8, "kaggle": 4,
    "startup": 8, "company-prototyping": 8, "company-training": 11,
}
PREPROCESSING = ("during", "before")


@dataclass(frozen=True)
class GPUGroup:
    """``count`` GPUs of one model, with the cooler they come with."""

    count: int = number("GPUs", 1, 1024, integer=True)
    cooler: str | None = text(choices=COOLERS, default=None)
    gpu: GPU | None = None

    @property
    def cooling(self) -> str | None:
        """The cooler given, else the catalog's reference design."""
        return self.cooler or self.gpu.cooler


@dataclass(frozen=True)
class PSU:
    watts: float | None = number("W", 100, 10000, default=None)
    efficiency: float | None = number("fraction", 0.5, 1.0, default=None)
    pcie_6pin: int | None = number("connectors", 0, 64, integer=True, default=None)
    pcie_8pin: int | None = number("connectors", 0, 64, integer=True, default=None)
    pcie_16pin: int | None = number("connectors", 0, 64, integer=True, default=None)
    eps_8pin: int | None = number("connectors", 0, 64, integer=True, default=None)


@dataclass(frozen=True)
class Board:
    gpu_slots: int | None = number("slots", 0, 64, integer=True, default=None)
    slot_pitch: int | None = number("slots", 1, 8, integer=True, default=None)
    pcie_gen: str | None = text(choices=PCIE_GENERATIONS, default=None)
    sockets: int | None = number("CPU sockets", 1, 8, integer=True, default=None)
    pcie_switches: int | None = number("PCIe switches", 0, 64, integer=True, default=None)
    lanes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Case:
    gpu_length_mm: float | None = number("mm", 100, 1000, default=None)
    radiators: int | None = number("radiator mounts", 0, 32, integer=True, default=None)


@dataclass(frozen=True)
class Storage:
    ssd_gb: float | None = number("GB", 0, 1e6, default=None)
    hdd_gb: float | None = number("GB", 0, 1e7, default=None)


@dataclass(frozen=True)
class Usage:
    preprocessing: str = text(choices=PREPROCESSING, default="during")
    use_case: str | None = text(choices=tuple(USE_CASES), default=None)
    fp16: bool = flag(default=False)
    hours: float | None = number("hours", 0, 1e6, default=None)
    price_per_kwh: float | None = number("per kWh", 0, 100, default=None)
    currency: str = text(default="€")
    draw_w: float | None = number("W", 1, 1e6, default=None)


@dataclass(frozen=True)
class Build:
    """Everything ``gpurig plan`` checks; a part left out is a rule not checked."""

    gpus: tuple[GPUGroup, ...]
    cpu: CPU | None = None
    ram_gb: float | None = None
    psu: PSU = PSU()
    board: Board = Board()
    storage: Storage = Storage()
    case: Case = Case()
    usage: Usage = Usage()
    nodes: int = 1
    network: Network | None = None
    other_nodes: tuple["Build", ...] = ()   # the cluster's other kinds of machine, each with its own count
    cluster_nodes: int | None = None        # machines in the whole cluster, when this is one kind of several

    def machines(self) -> list["Build"]:
        """Every kind of machine in the cluster, this one first (each ``nodes`` times).

        >>> b = build_from({"gpus": [{"model": "GTX Titan", "count": 3}],
        ...                 "other_nodes": [{"gpus": [{"model": "GTX Titan"}]}]}, "x")
        >>> [(m.nodes, m.gpu_count) for m in b.machines()]
        [(1, 3), (1, 1)]
        """
        return [self, *self.other_nodes]

    @property
    def node_count(self) -> int:
        """Machines in the cluster, every kind."""
        return sum(m.nodes for m in self.machines())

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster, every kind."""
        return sum(m.nodes * m.gpu_count for m in self.machines())

    @property
    def gpu_count(self) -> int:
        """GPUs in one machine."""
        return sum(g.count for g in self.gpus)

    def each_gpu(self) -> list[GPU]:
        """One entry per GPU in a machine, in slot order."""
        return [g.gpu for g in self.gpus for _ in range(g.count)]


_TOP = ("ram_gb", "gpus", "cpu", "psu", "board", "storage", "case", "usage", "cluster", "other_nodes")


def _table(data: dict, key: str, where: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(f"{where}: [{key}]: expected a table, got {value!r}")
    return value


def _lanes(value, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise SpecError(f"{where}: lanes: expected a list of whole numbers like [16, 8, 8, 8], got {value!r}")
    bad = [v for v in value if v not in (1, 2, 4, 8, 16)]
    if bad:
        raise SpecError(f"{where}: lanes: {bad[0]} is not a PCIe link width (1, 2, 4, 8 or 16)")
    return tuple(value)


def build_from(data: dict, where: str, in_cluster: bool = False) -> Build:
    """A checked :class:`Build` from a parsed build file (or the same structure made from flags); ``in_cluster``: one
    kind of machine of a cluster (an ``other_nodes`` table), which may be a single machine on the network."""
    unknown_keys(data, _TOP, where)
    groups = data.get("gpus")
    if not isinstance(groups, list) or not groups:
        raise SpecError(f"{where}: gpus: missing (at least one [[gpus]] table with a model, or --gpu)")
    gpus = []
    for i, group in enumerate(groups):
        at = f"{where}: gpus[{i}]"
        if not isinstance(group, dict):
            raise SpecError(f"{at}: expected a table, got {group!r}")
        if "model" not in group:
            raise SpecError(f"{at}: model: missing (a GPU name such as 'RTX 2080 Ti')")
        gpus.append(from_mapping(GPUGroup, {"count": 1, **group}, at, extra=("model",),
                                 given={"gpu": gpu_from(group["model"], f"{at}.model")}))
    ram = data.get("ram_gb")
    if ram is not None and (isinstance(ram, bool) or not isinstance(ram, (int, float)) or not 0 < ram <= 1e6):
        raise SpecError(f"{where}: ram_gb: expected a positive number of GB, got {ram!r}")
    board_table = _table(data, "board", where)
    board = from_mapping(Board, board_table, f"{where}: [board]", extra=("lanes",),
                         given={"lanes": _lanes(board_table["lanes"], f"{where}: [board]") if "lanes" in board_table else ()})
    count = sum(g.count for g in gpus)
    if board.lanes and len(board.lanes) != count:
        raise SpecError(f"{where}: [board] lanes: {len(board.lanes)} widths for {count} GPUs: give one per GPU, "
                        f"e.g. {[16] + [8] * (count - 1) if count > 1 else [16]}")
    others = data.get("other_nodes", [])
    if not isinstance(others, list) or not all(isinstance(o, dict) for o in others):
        raise SpecError(f"{where}: other_nodes: expected [[other_nodes]] tables, got {others!r}")
    cluster = _table(data, "cluster", where)
    unknown_keys(cluster, ("nodes", "network"), f"{where}: [cluster]")
    nodes = cluster.get("nodes", 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise SpecError(f"{where}: [cluster]: nodes: expected a whole number ≥ 1, got {nodes!r}")
    others = [build_from(o, f"{where}: other_nodes[{i}]", in_cluster=True) for i, o in enumerate(others)]
    network = network_from(cluster["network"], f"{where}: [cluster] network") if "network" in cluster else None
    if network is not None and nodes == 1 and not others and not in_cluster:
        raise SpecError(f"{where}: [cluster] network: one machine has no network between its GPUs: give the "
                        f"machines it joins ([cluster] nodes = 2, --nodes 2), or leave it out")
    if others:  # every machine of the cluster has the cluster's network card
        total = nodes + sum(o.nodes for o in others)
        others = [dataclasses.replace(o, network=o.network or network, cluster_nodes=total) for o in others]
    return Build(
        cluster_nodes=nodes + sum(o.nodes for o in others) if others else None,
        gpus=tuple(gpus),
        cpu=from_mapping(CPU, data["cpu"], f"{where}: [cpu]") if "cpu" in data else None,
        ram_gb=ram, board=board, nodes=nodes,
        psu=from_mapping(PSU, _table(data, "psu", where), f"{where}: [psu]"),
        storage=from_mapping(Storage, _table(data, "storage", where), f"{where}: [storage]"),
        case=from_mapping(Case, _table(data, "case", where), f"{where}: [case]"),
        usage=from_mapping(Usage, _table(data, "usage", where), f"{where}: [usage]"),
        network=network, other_nodes=tuple(others))


def load_build(path: str | Path) -> dict:
    """The raw build file at ``path`` (checked when passed to :func:`build_from`, after flags are applied)."""
    return read_toml(path)


def _gpu_value(gpu) -> str | dict:
    """How a spec's GPU is named in a build: the catalog's name, or the whole description where the spec gave its
    own (a GPU the catalog lacks, or a catalog GPU with fields changed)."""
    from gpurig.spec import catalog
    from gpurig.spec.fields import to_mapping

    try:
        if catalog.gpu(gpu.name) == gpu:
            return gpu.name
    except SpecError:
        pass
    return {k: v for k, v in to_mapping(gpu).items() if v is not None}


def build_data_from_spec(spec: ClusterSpec) -> dict:
    """The build-file structure of a cluster spec (doctor's facts, a description): its first ``[[nodes]]``
    table with GPUs, the others with GPUs as ``other_nodes`` (nodes without GPUs are left out).

    >>> from gpurig.spec.describe import parse_description
    >>> build_data_from_spec(parse_description("2 nodes x 4 2080ti, PCIe 3.0 x8"))["board"]
    {'lanes': [8, 8, 8, 8], 'pcie_gen': '3.0'}
    """
    # a head or storage node without GPUs is no machine the rules check (the build's rules are the GPUs' boxes)
    machines = [node for node in spec.nodes if node.gpus and node.gpu is not None] or list(spec.nodes)
    first, *others = [_node_data(node) for node in machines]
    if others:
        first["other_nodes"] = others
    if spec.network is not None and (spec.node_count > 1):
        first.setdefault("cluster", {})["network"] = dataclasses.asdict(spec.network)
    return first


def _node_data(node) -> dict:
    data: dict = {"gpus": [{"model": _gpu_value(node.gpu), "count": node.gpus}] if node.gpus else []}
    if node.ram_gb is not None:
        data["ram_gb"] = node.ram_gb
    if node.cpu is not None:
        data["cpu"] = {k: v for k, v in dataclasses.asdict(node.cpu).items() if v is not None}
    board: dict = {}
    if node.pcie_lanes and node.gpus:
        board["lanes"] = [node.pcie_lanes] * node.gpus
    if node.pcie_gen:
        board["pcie_gen"] = node.pcie_gen
    for key in ("sockets", "pcie_switches"):
        if getattr(node, key) is not None:
            board[key] = getattr(node, key)
    if board:
        data["board"] = board
    if node.disks:
        ssd = sum(d.size_gb or 0 for d in node.disks if d.kind == "ssd")
        hdd = sum(d.size_gb or 0 for d in node.disks if d.kind == "hdd")
        data["storage"] = {"ssd_gb": ssd, "hdd_gb": hdd}
    if node.count > 1:
        data["cluster"] = {"nodes": node.count}
    return data
