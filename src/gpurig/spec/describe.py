"""A cluster from one line: "2 nodes × 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand, no GPUDirect".

Comma-separated parts, in any order:

- GPUs: ``[N node(s) ×] [M ×] GPU name`` — "4 RTX 2080 Ti", "2 nodes x 8 A100", "V100"
- PCIe: ``PCIe 3.0 x8`` (the generation and the lanes each GPU gets)
- network: a catalog name ("InfiniBand FDR", "10GbE", "EDR") or a rate and a kind, either way round
  ("40 Gbit/s InfiniBand", "1 Gbit/s Ethernet", "25 Gbit/s RoCE", "InfiniBand 100 Gbit", "10 Gb Ethernet");
  the stated rate is used as it is; RoCE (or "RDMA") is priced as RDMA, like InfiniBand
- GPUDirect RDMA: ``GPUDirect`` / ``GPUDirect RDMA`` or ``no GPUDirect``
- the GPUs' own link: ``NVLink`` (``NVLink 2.0``, ``NVSwitch``, ``NVLink bridge``, ``Infinity Fabric``): inside a
  node the GPUs talk over it whenever the catalog lists it for them, so this part only confirms it (an error
  for a GPU that has none)
- RAM: ``64 GB RAM``
- how the board wires the GPUs: ``2 sockets`` (or ``2 CPUs``: GPUs split over them, pairs across them copy
  through host memory), ``2 PCIe switches`` (or ``2 PLX``: GPUs behind one switch talk directly)
"""

from __future__ import annotations

import re

from gpurig.spec import catalog
from gpurig.spec.cluster import MAX_GPUS_PER_NODE, ClusterSpec, NodeSpec, parse_network
from gpurig.spec.fields import SpecError, from_mapping

_TIMES = r"\s*(?:×|x|\*)\s*"
_GPUS = re.compile(rf"^(?:(?P<nodes>\d+)\s*nodes?{_TIMES})?(?:(?P<gpus>\d+){_TIMES}|(?P<gpus2>\d+)\s+)?(?P<name>.+)$", re.I)
_PCIE = re.compile(r"^pcie\s*(?:gen\s*)?(?P<gen>\d(?:\.\d)?)?\s*(?:x\s*(?P<lanes>\d+))?$", re.I)
_RAM = re.compile(r"^(?P<gb>[0-9.]+)\s*(?:GB|GiB)\s+(?:of\s+)?RAM$", re.I)
_SOCKETS = re.compile(r"^(?P<n>\d+)\s*(?:cpu\s*)?(?:sockets?|cpus?)$", re.I)
_GPU_LINK = re.compile(r"^(?:nvlink(?:\s*\d(?:\.\d)?)?(?:\s+bridges?)?|nvswitch|infinity\s+fabric)$", re.I)
# NVIDIA's DGX systems, named where a GPU is expected: what to write instead (the catalog has GPUs, not systems)
SYSTEMS = {
    "dgx-1": ("8 x V100 SXM2 16GB, NVLink", "a DGX-1 with V100s; the first, of 2016, had '8 x P100 SXM2'"),
    "dgx-2": ("16 x V100 SXM2 32GB, NVSwitch", "its V100s are SXM3 parts, priced as the SXM2 32 GB"),
    "dgx a100": ("8 x A100 SXM4 80GB, NVSwitch", "or A100 SXM4 40GB"),
    "dgx h100": ("8 x H100 SXM5 80GB, NVSwitch", None),
    "dgx b200": ("8 x B200, NVSwitch", None),
}
_SYSTEM = re.compile(r"^(?:dgx|hgx)(?:[-\s]+(?P<model>.*))?$", re.I)
_SWITCHES = re.compile(r"^(?P<n>\d+)\s*(?:pcie\s+switch(?:es)?|plx(?:\s+switch(?:es)?)?)$", re.I)


def parse_description(text: str) -> ClusterSpec:
    """The :class:`ClusterSpec` a one-line description names.

    >>> spec = parse_description("2 nodes × 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand, no GPUDirect")
    >>> spec.node_count, spec.total_gpus, spec.nodes[0].gpu.name, spec.nodes[0].pcie_lanes, spec.network.gbit_per_s
    (2, 8, 'GeForce RTX 2080 Ti', 8, 40.0)
    >>> parse_description("8 x V100 SXM2 16GB, NVLink").nodes[0].gpu.gpu_link_gbs
    300.0
    >>> node = parse_description("8 K20, PCIe 2.0 x16, 2 sockets, 2 PCIe switches").nodes[0]
    >>> node.sockets, node.pcie_switches
    (2, 2)
    >>> parse_description("0 nodes x 4 A100")
    Traceback (most recent call last):
    ...
    gpurig.spec.fields.SpecError: in '0 nodes x 4 A100': count: 0 nodes is outside 1–100000 nodes
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise SpecError("empty cluster description: e.g. '2 nodes × 4 RTX 2080 Ti, PCIe 3.0 x8, 40 Gbit/s InfiniBand'")
    node: dict = {}
    network, gpudirect, named, link_part = None, False, set(), None

    def once(what: str, part: str) -> None:
        if what in named:
            raise SpecError(f"the cluster description {text!r} names the {what} twice (again in {part!r}): "
                            "give each once")
        named.add(what)

    for part in parts:
        low = part.lower()
        if re.match(r"^[-−]\s*\d", part):  # a fuzzy catalog match would take "-10GbE" for 10GbE
            raise SpecError(f"in {part!r}: counts and rates must be positive")
        if (match := _PCIE.match(part)) and low.startswith("pcie"):
            once("PCIe link", part)
            if match["gen"]:
                node["pcie_gen"] = catalog.pcie_generation(match["gen"]).generation
            if match["lanes"]:
                node["pcie_lanes"] = int(match["lanes"])
        elif "gpudirect" in low:
            once("GPUDirect setting", part)
            gpudirect = not low.startswith("no")
        elif _GPU_LINK.match(part):
            once("GPU link", part)
            link_part = part
        elif match := _RAM.match(part):
            once("RAM", part)
            node["ram_gb"] = float(match["gb"])
        elif match := _SOCKETS.match(part):
            node["sockets"] = from_mapping(NodeSpec, {"gpus": 0, "sockets": int(match["n"])}, f"in {part!r}").sockets
        elif match := _SWITCHES.match(part):
            node["pcie_switches"] = from_mapping(NodeSpec, {"gpus": 0, "pcie_switches": int(match["n"])},
                                                 f"in {part!r}").pcie_switches
        elif (found := parse_network(part)) is not None:
            once("network", part)
            network = found
        elif (match := _GPUS.match(part)) and not ("GPUs" in named and not catalog.knows_gpu(match["name"])):
            once("GPUs", part)
            try:
                node["gpu"] = catalog.gpu(match["name"])
            except SpecError as error:
                whole = _after_nodes(part, match)
                if not one_gpu_name(whole, int(match["gpus"] or match["gpus2"] or 0), match["name"]):
                    raise SpecError(f"in {part!r}: {_system_hint(match['name']) or error}") from None
                try:   # "7900 XTX" is one GPU, not 7900 of an "XTX"; "7900 xt" an unknown one
                    node["gpu"] = catalog.gpu(whole)
                except SpecError as unknown:
                    raise SpecError(f"in {part!r}: {unknown}") from None
                match = {"nodes": match["nodes"], "gpus": None, "gpus2": None}
            node["gpus"] = int(match["gpus"] or match["gpus2"] or 1)
            node["count"] = int(match["nodes"] or 1)
            # the bounds a spec file's [[nodes]] table has (a description always names GPUs: at least one)
            from_mapping(NodeSpec, {"gpus": node["gpus"], "count": node["count"]}, f"in {part!r}", given={"gpu": node["gpu"]})
            if node["gpus"] < 1:
                raise SpecError(f"in {part!r}: a node needs at least 1 GPU, got {node['gpus']}")
        elif re.fullmatch(r"(infiniband|ib|ethernet|roce)", low):
            infiniband = low in ("infiniband", "ib")
            raise SpecError(f"in {part!r}: which {part}? give its rate{' or generation' if infiniband else ''}, e.g. "
                            f"'100 Gbit/s {part}'" + (", 'EDR', 'HDR' or 'NDR' (100, 200, 400 Gbit/s)" if infiniband
                                                       else ", '10 GbE' or '25 GbE'"))
        else:
            raise SpecError(f"cannot read {part!r} in the cluster description (expected GPUs, 'PCIe 3.0 x8', "
                            "a network such as '40 Gbit/s InfiniBand', 'no GPUDirect', '64 GB RAM', '2 sockets' or '2 PCIe switches')")
    if "gpu" not in node:
        raise SpecError(f"the cluster description {text!r} names no GPU (e.g. '4 RTX 2080 Ti')")
    if link_part is not None and not getattr(node["gpu"], "gpu_link_gbs", None):
        raise SpecError(f"in {link_part!r}: the catalog lists no NVLink or Infinity Fabric for the {node['gpu'].name}; "
                        "its GPUs talk over PCIe (leave the part out)")
    # through the field checks, as a spec file's [[nodes]] table is: PCIe x0 or 0 GB of RAM refused, not priced
    node_spec = from_mapping(NodeSpec, {k: v for k, v in node.items() if k != "gpu"}, f"in {text!r}",
                             given={"gpu": node["gpu"]})
    return ClusterSpec(nodes=(node_spec,), network=network, gpudirect_rdma=gpudirect, name=text)


def one_gpu_name(whole: str, count: int, name: str) -> bool:
    """Whether ``whole`` ("7900 XTX", "7900 xt"), read as ``count`` GPUs of ``name``, is one GPU's name instead:
    ``name`` is no catalog GPU, and ``whole`` is one, or ``count`` is more GPUs than a machine holds.

    >>> one_gpu_name("7900 XTX", 7900, "XTX"), one_gpu_name("7900 xt", 7900, "t"), one_gpu_name("4x3090", 4, "3090")
    (True, True, False)
    """
    return count > 0 and not catalog.knows_gpu(name) and (catalog.knows_gpu(whole) or count > MAX_GPUS_PER_NODE)


def _after_nodes(part: str, match) -> str:
    """``part`` without its leading ``N nodes x``.

    >>> _after_nodes("2 nodes x 7900 XT", _GPUS.match("2 nodes x 7900 XT"))
    '7900 XT'
    """
    rest = re.sub(rf"^\s*{match['nodes']}\s*nodes?{_TIMES}", "", part, flags=re.I) if match["nodes"] else part
    return rest.strip()


def _system_hint(name: str) -> str | None:
    """What to write for a whole system named where a GPU is expected, or None for a name that is no system.

    >>> _system_hint("DGX A100")
    "'DGX A100' is a system, not a GPU: describe its GPUs, e.g. '8 x A100 SXM4 80GB, NVSwitch' (or A100 SXM4 40GB)"
    """
    match = _SYSTEM.match(name.strip())
    if match is None:
        return None
    model = (match["model"] or "").lower()
    example, remark = SYSTEMS.get("dgx-1" if model == "1" else "dgx-2" if model == "2" else f"dgx {model}",
                                  ("4 x A100 SXM4 80GB, NVLink", "its GPU count and model, and their link"))
    return (f"{name.strip()!r} is a system, not a GPU: describe its GPUs, e.g. '{example}'"
            + (f" ({remark})" if remark else ""))
