"""The cluster spec: nodes (GPUs, PCIe, CPU, RAM, disks, NICs) and the network between them, in TOML.

One description of the hardware for ``plan``, ``predict`` and ``run``: written
by ``gpurig doctor --write-spec``, by hand, or parsed from a one-line catalog
description (:mod:`gpurig.spec.describe`). Example::

    name = "2 nodes x 4 RTX 2080 Ti"
    gpudirect_rdma = false

    [network]
    name = "InfiniBand FDR"          # a catalog name, or give gbit_per_s (and data_gbit_per_s)

    [[nodes]]
    count = 2                        # nodes like this one
    gpu = "RTX 2080 Ti"              # a catalog name, or a [nodes.gpu] table
    gpus = 4
    pcie_gen = "3.0"
    pcie_lanes = 8                   # per GPU
    sockets = 1                      # CPU sockets the GPUs are spread over (2: some pairs cross the CPUs' link)
    pcie_switches = 0                # PCIe switches (PLX) the GPUs sit behind
    ram_gb = 64
    [nodes.cpu]
    cores = 8
    threads = 16

A cluster of different machines has one ``[[nodes]]`` table per kind (the
multi-GPU post's 3 + 1: ``gpus = 3``, then ``gpus = 1``); ``plan`` checks each
and ``predict`` fills them with ranks in order (examples/cluster-3+1-titan.toml).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from gpurig.spec import catalog
from gpurig.spec.fields import SpecError, flag, from_mapping, number, text, to_mapping
from gpurig.spec.hardware import GPU, Network, PCIE_GENERATIONS
from gpurig.spec.tomlio import read_toml, write_toml
from gpurig.units import gbit_per_s


@dataclass(frozen=True)
class CPU:
    """The processor(s) of a node."""

    cores: int | None = number("cores", 1, 4096, integer=True, default=None)
    model: str | None = text(default=None)
    threads: int | None = number("threads", 1, 8192, integer=True, default=None)
    ghz: float | None = number("GHz", 0.2, 10, default=None)
    tdp_w: float | None = number("W", 1, 2000, default=None)
    pcie_lanes: int | None = number("lanes", 1, 512, integer=True, default=None)


@dataclass(frozen=True)
class Disk:
    """A block device: SSD or HDD, its size, and optionally its measured read rate."""

    name: str = text()
    kind: str = text(choices=("ssd", "hdd"))
    size_gb: float | None = number("GB", 0.001, 1e6, default=None)
    read_mb_s: float | None = number("MB/s", 0.1, 1e6, default=None)


@dataclass(frozen=True)
class NIC:
    """A network interface and its link speed (None when the link reports none)."""

    name: str = text()
    gbit_per_s: float | None = number("Gbit/s", 0.001, 10000, default=None)
    kind: str | None = text(default=None)


MAX_GPUS_PER_NODE = 1024   # a bound for typos, far above any real machine
MOST_GPUS_IN_A_MACHINE = 16   # what real machines hold: 8 in most servers (DGX, HGX), 16 in the largest (DGX-2)


def too_many_gpus(gpus: int, what: str = "...") -> str:
    """Why one machine of ``gpus`` GPUs is no machine there is, with how to write it as a cluster of ``what``, or "".

    >>> too_many_gpus(1000, "A100, 100 Gb InfiniBand")
    "no machine holds 1000 GPUs (8 in most servers, 16 in the largest): a cluster is '125 nodes x 8 A100, 100 Gb InfiniBand'"
    >>> too_many_gpus(8)
    ''
    """
    if gpus <= MOST_GPUS_IN_A_MACHINE:
        return ""
    return (f"no machine holds {gpus} GPUs (8 in most servers, {MOST_GPUS_IN_A_MACHINE} in the largest): "
            f"a cluster is '{-(-gpus // 8)} nodes x 8 {what}'")


@dataclass(frozen=True)
class NodeSpec:
    """``count`` identical machines, each with ``gpus`` GPUs of one model (``gpu`` None when there are none)."""

    gpus: int = number("GPUs", 0, MAX_GPUS_PER_NODE, integer=True)
    gpu: GPU | None = None
    count: int = number("nodes", 1, 100000, integer=True, default=1)
    pcie_gen: str | None = text(choices=PCIE_GENERATIONS, default=None)
    pcie_lanes: int | None = number("lanes per GPU", 1, 16, integer=True, default=None)
    # how the board wires the GPUs (spread evenly, filled in order): traffic between GPUs of two sockets is copied
    # through host memory across the CPUs' interconnect; GPUs behind one PCIe switch (PLX) talk directly
    sockets: int | None = number("CPU sockets", 1, 8, integer=True, default=None)
    pcie_switches: int | None = number("PCIe switches", 0, 64, integer=True, default=None)
    ram_gb: float | None = number("GB", 0.1, 1e6, default=None)
    hostname: str | None = text(default=None)
    peer_to_peer: bool | None = flag(default=None)
    mpi: str | None = text(default=None)
    mpi_cuda_aware: bool | None = flag(default=None)
    cpu: CPU | None = None
    disks: tuple[Disk, ...] = ()
    nics: tuple[NIC, ...] = ()

    def __post_init__(self):
        if self.gpus and self.gpu is None:
            raise SpecError(f"node with {self.gpus} GPUs names no GPU model")


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes and the network joining them.

    >>> spec = ClusterSpec(nodes=(NodeSpec(gpus=4, gpu=catalog.gpu("2080ti"), count=2),))
    >>> spec.total_gpus, spec.node_count
    (8, 2)
    """

    nodes: tuple[NodeSpec, ...]
    network: Network | None = None
    gpudirect_rdma: bool = False
    name: str | None = None

    @property
    def node_count(self) -> int:
        return sum(n.count for n in self.nodes)

    @property
    def total_gpus(self) -> int:
        return sum(n.count * n.gpus for n in self.nodes)


# -- reading ------------------------------------------------------------------

_NODE_TABLES = ("gpu", "cpu", "disks", "nics")


def gpu_from(value, where: str) -> GPU:
    """A GPU from a spec value: a catalog name, or a table (a catalog name plus overrides, or a full description).

    >>> gpu_from("2080ti", "x").memory_gb
    11.0
    >>> gpu_from({"name": "2080ti", "memory_gb": 22}, "x").memory_gb
    22
    """
    if isinstance(value, str):
        try:
            return catalog.gpu(value)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise SpecError(f"{where}: expected a GPU name or a table with a name, got {value!r}")
    try:
        base = catalog.gpu(value["name"])
    except SpecError:
        return from_mapping(GPU, value, where)
    checked = from_mapping(GPU, {**to_mapping(base), **value}, where)
    return dataclasses.replace(checked, name=base.name)


# "40 Gbit/s", "56Gbps", "100 Gbit", "10 Gb" (a link's rate is per second, so "/s" may be left out after bits;
# a lowercase b: "10 GB" is bytes), before or after its kind ("InfiniBand 100 Gbit")
_RATE_TEXT = r"[0-9.]+\s*[kMGT]?(?:bit|b)/s|[0-9.]+\s*[kMGT]bps|[0-9.]+\s*[kMGT]bit\b|(?-i:[0-9.]+\s*[kKMGT]b)\b"
_RATE = re.compile(rf"^(?P<rate>{_RATE_TEXT})\s*(?P<kind>.*)$", re.I)
_KIND_RATE = re.compile(rf"^(?P<kind>[a-z][^0-9]*?)\s*(?P<rate>{_RATE_TEXT})$", re.I)


def parse_network(text: str) -> Network | None:
    """A network from words: a catalog name ("FDR", "10GbE") or a rate and a kind ("40 Gbit/s InfiniBand",
    used at the stated rate); None when the words are neither.

    >>> parse_network("40 Gbit/s InfiniBand").kind, parse_network("EDR").gbit_per_s, parse_network("x4 A100")
    ('infiniband', 100.0, None)
    >>> parse_network("100 Gbit InfiniBand").gbit_per_s, parse_network("Ethernet 10 Gb").gbit_per_s
    (100.0, 10.0)
    >>> parse_network("25 Gbit/s RoCE").kind          # RDMA over Converged Ethernet: RDMA, as InfiniBand
    'roce'
    """
    match = _RATE.match(text) or _KIND_RATE.match(text)
    if match:
        rate = match["rate"]
        try:
            gbit = gbit_per_s(rate if "/" in rate or rate.lower().endswith("ps") else rate + "/s")
        except ValueError as error:
            raise SpecError(f"in {text!r}: {error}") from None
        words = match["kind"].lower()
        kind = "infiniband" if ("infiniband" in words or re.search(r"\bib\b", words)) else \
            "roce" if ("roce" in words or "rdma" in words) else \
            "ethernet" if ("ethernet" in words or "gbe" in words) else "other"
        # through the field checks, as a spec file's network is: 0 Gbit/s is refused, not divided by
        return from_mapping(Network, {"name": text, "kind": kind, "gbit_per_s": gbit, "data_gbit_per_s": gbit,
                                      "source": "cluster description"}, f"in {text!r}")
    try:
        return catalog.network(text)
    except SpecError:
        return None


def network_from(value, where: str) -> Network:
    """A network from a spec value: a catalog name, a rate and a kind, or a table with ``gbit_per_s``.

    >>> network_from("EDR", "x").gbit_per_s, network_from({"name": "lab", "gbit_per_s": 25}, "x").data_gbit_per_s
    (100.0, 25)
    >>> network_from("40 Gbit/s InfiniBand", "x").gbit_per_s
    40.0
    """
    if isinstance(value, str):
        try:
            found = parse_network(value)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
        if found is not None:
            return found
        try:
            return catalog.network(value)
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
    if not isinstance(value, dict):
        raise SpecError(f"{where}: expected a network name or table, got {value!r}")
    if "gbit_per_s" not in value and isinstance(value.get("name"), str):
        try:
            return catalog.network(value["name"])
        except SpecError as error:
            raise SpecError(f"{where}: {error}") from None
    value = {"name": "network", "kind": "other", **value}
    value.setdefault("data_gbit_per_s", value.get("gbit_per_s"))
    return from_mapping(Network, value, where)


def _list_of(cls, values, where: str) -> tuple:
    if not isinstance(values, list):
        raise SpecError(f"{where}: expected a list of tables, got {values!r}")
    return tuple(from_mapping(cls, item, f"{where}[{i}]") for i, item in enumerate(values))


def node_from(table, where: str) -> NodeSpec:
    """One ``[[nodes]]`` table as a :class:`NodeSpec`."""
    if not isinstance(table, dict):
        raise SpecError(f"{where}: expected a table, got {table!r}")
    gpu = gpu_from(table["gpu"], f"{where}.gpu") if "gpu" in table else None
    if gpu is None and isinstance(table.get("gpus"), int) and table["gpus"] > 0:
        raise SpecError(f"{where}: gpu: missing (the node has {table['gpus']} GPUs)")
    if gpu is not None and table.get("gpus") == 0:
        raise SpecError(f"{where}: gpu = {table['gpu']!r} with gpus = 0: give how many it has, or leave gpu out for a "
                        "machine without GPUs")
    given = {"gpu": gpu,
             "cpu": from_mapping(CPU, table["cpu"], f"{where}.cpu") if "cpu" in table else None,
             "disks": _list_of(Disk, table.get("disks", []), f"{where}.disks"),
             "nics": _list_of(NIC, table.get("nics", []), f"{where}.nics")}
    return from_mapping(NodeSpec, table, where, extra=_NODE_TABLES, given=given)


def spec_from(data: dict, where: str) -> ClusterSpec:
    """A :class:`ClusterSpec` from parsed TOML; ``where`` names the file in errors."""
    from gpurig.spec.fields import unknown_keys

    unknown_keys(data, ["name", "gpudirect_rdma", "network", "nodes"], where)
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise SpecError(f"{where}: nodes: missing (at least one [[nodes]] table)")
    gpudirect = data.get("gpudirect_rdma", False)
    if not isinstance(gpudirect, bool):
        raise SpecError(f"{where}: gpudirect_rdma: expected true or false, got {gpudirect!r}")
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"{where}: name: expected text, got {name!r}")
    network = network_from(data["network"], f"{where}: network") if "network" in data else None
    return ClusterSpec(nodes=tuple(node_from(n, f"{where}: nodes[{i}]") for i, n in enumerate(nodes)),
                       network=network, gpudirect_rdma=gpudirect, name=name)


def load_spec(path: str | Path) -> ClusterSpec:
    """Read and check the cluster spec at ``path`` (one-line :class:`SpecError` on any problem)."""
    return spec_from(read_toml(path), str(path))


# -- writing ------------------------------------------------------------------

def gpu_to_toml(gpu: GPU):
    """The catalog name when the GPU is the catalog's, else its fields as a table."""
    try:
        if catalog.gpu(gpu.name) == gpu:
            return gpu.name
    except SpecError:
        pass
    return to_mapping(gpu)


def spec_to_dict(spec: ClusterSpec) -> dict:
    """The TOML structure of ``spec`` (what :func:`spec_from` reads back)."""
    out: dict = {}
    if spec.name:
        out["name"] = spec.name
    out["gpudirect_rdma"] = spec.gpudirect_rdma
    if spec.network is not None:
        out["network"] = to_mapping(spec.network)
    nodes = []
    for node in spec.nodes:
        table = to_mapping(node)
        if node.gpu is not None:
            table["gpu"] = gpu_to_toml(node.gpu)
        if node.cpu is not None:
            table["cpu"] = to_mapping(node.cpu)
        if node.disks:
            table["disks"] = [to_mapping(d) for d in node.disks]
        if node.nics:
            table["nics"] = [to_mapping(n) for n in node.nics]
        nodes.append(table)
    out["nodes"] = nodes
    return out


def save_spec(spec: ClusterSpec, path: str | Path, header: str = "") -> None:
    """Write ``spec`` as TOML to ``path``; :func:`load_spec` reads it back equal."""
    write_toml(path, spec_to_dict(spec), header or "gpurig cluster spec (see docs/hardware.md)")
