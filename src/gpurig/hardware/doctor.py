"""``gpurig doctor``: probe this machine, hold it against the hardware guide's rules, write it as a cluster spec.

The facts come from :mod:`gpurig.hardware.probe` (CPU, RAM, disks, NICs, NVML, MPI);
the rules are :mod:`gpurig.hardware.rules`' (those a running machine can be checked
against) plus what only a running machine shows: PCIe links narrower than the
card's, throttling, heat, missing peer-to-peer, MPI that is not CUDA-aware.
"""

from __future__ import annotations

import dataclasses
import platform

from gpurig.hardware import rules
from gpurig.hardware.probe import fans
from gpurig.hardware.probe import mpi as mpi_probe
from gpurig.hardware.probe import nvml, system
from gpurig.hardware.rules import INFO, OK, WARNING, Verdict
from gpurig.spec import catalog
from gpurig.spec.build import build_from
from gpurig.spec.cluster import CPU, NIC, ClusterSpec, Disk, NodeSpec, save_spec, spec_to_dict
from gpurig.spec.fields import SpecError
from gpurig.spec.hardware import GPU

MACHINE_RULES = [rules.gpu_memory, rules.mixed_gpus, rules.ram_size, rules.cpu_threads, rules.cpu_clock,
                 rules.pcie_lanes, rules.pcie_generation, rules.storage]
HOT_C = 80  # the guide: GPUs throttle at about 80 °C


def probe() -> dict:
    """Every fact about this machine, as plain data."""
    return {"hostname": platform.node(), "cpu": system.cpu(), "ram_gb": system.ram_gb(), "disks": system.disks(),
            "nics": system.nics(), "nvml": nvml.gpus(), "mpi": mpi_probe.mpi(), "fans": fans.fan_control()}


def gpu_of(device: dict, host: str) -> GPU:
    """The catalog's GPU for an NVML device name, else a GPU made of what NVML reported.

    >>> gpu_of({"name": "NVIDIA GeForce RTX 2080 Ti"}, "h").name
    'GeForce RTX 2080 Ti'
    >>> gpu_of({"name": "NVIDIA Future GPU", "memory_gb": 200.0, "power_limit_w": 900}, "h").source
    'NVML on h (not in the catalog)'
    """
    try:
        return catalog.gpu(device["name"])
    except SpecError:
        return GPU(name=device["name"], memory_gb=device.get("memory_gb") or 1.0, source=f"NVML on {host} (not in the catalog)",
                   vendor="NVIDIA", tdp_w=device.get("power_limit_w"))


def node_spec(facts: dict) -> NodeSpec:
    """This machine as a :class:`NodeSpec` (the first GPU model when several are mixed)."""
    devices = facts["nvml"]["gpus"]
    host = facts["hostname"]
    gens = [d["pcie_gen_max"] for d in devices if d.get("pcie_gen_max")]
    widths = [d["pcie_width"] for d in devices if d.get("pcie_width")]
    pairs = [p["p2p"] for p in facts["nvml"]["pairs"] if p["p2p"] is not None]
    sockets, switches = wiring(facts["nvml"]["pairs"], len(devices))
    cpu = facts["cpu"]
    return NodeSpec(
        gpus=len(devices), gpu=gpu_of(devices[0], host) if devices else None, hostname=host,
        pcie_gen=f"{min(gens)}.0" if gens else None, pcie_lanes=min(widths) if widths else None,
        sockets=sockets, pcie_switches=switches, ram_gb=facts["ram_gb"], peer_to_peer=all(pairs) if pairs else None,
        mpi=facts["mpi"].get("library"), mpi_cuda_aware=facts["mpi"].get("cuda_aware"),
        cpu=CPU(cores=cpu["cores"], threads=cpu["threads"], model=cpu["model"], ghz=cpu["ghz"]),
        disks=tuple(Disk(name=d["name"], kind=d["kind"], size_gb=d["size_gb"]) for d in facts["disks"]),
        nics=tuple(NIC(name=n["name"], gbit_per_s=n["gbit_per_s"], kind=n["kind"]) for n in facts["nics"]))


def wiring(pairs: list[dict], gpus: int) -> tuple[int | None, int | None]:
    """(sockets, PCIe switches) the GPUs sit on, from NVML's topology of each pair (what ``nvidia-smi topo -m``
    shows): a pair across CPUs means two sockets; GPUs joined through one switch are one switch's group.

    >>> wiring([{"gpus": [0, 1], "topology": "same PCIe switch"}, {"gpus": [2, 3], "topology": "same PCIe switch"},
    ...         {"gpus": [0, 2], "topology": "across CPUs (SMP link)"}], 4)
    (2, 2)
    >>> wiring([], 1)
    (None, None)
    """
    if not pairs:
        return None, None
    sockets = 2 if any(p["topology"] == "across CPUs (SMP link)" for p in pairs) else 1
    group = list(range(gpus))

    def root(i):
        while group[i] != i:
            i = group[i]
        return i

    for p in pairs:
        if p["topology"] in ("same PCIe switch", "PCIe switches"):
            a, b = map(root, p["gpus"])
            group[a] = b
    sizes = {}
    for i in range(gpus):
        sizes[root(i)] = sizes.get(root(i), 0) + 1
    return sockets, sum(1 for n in sizes.values() if n > 1)


def fan_checks(facts: dict) -> list[Verdict]:
    """Whether software can set the GPUs' fans (the guide: set Coolbits; headless GPUs need an emulated monitor)."""
    if not facts["nvml"]["gpus"] or "fans" not in facts:
        return []
    f = facts["fans"]
    if f["fan_control"]:
        return [Verdict("fan control", OK, f"Coolbits {f['coolbits']}",
                        "fans can be set (nvidia-settings -a GPUFanControlState=1 -a GPUTargetFanSpeed=…)")]
    open_air = [d["name"] for d in facts["nvml"]["gpus"] if (gpu_of(d, "").cooler or "") == "open"]
    return [Verdict("fan control", WARNING if len(facts["nvml"]["gpus"]) > 1 else INFO,
                    "Coolbits not set" if f["coolbits"] is None else f"Coolbits {f['coolbits']} (no fan bit)",
                    "the fans follow the driver's curve and the GPUs throttle at ~80 °C: set Coolbits "
                    "(sudo nvidia-xconfig --cool-bits=4, restart X) to run them faster; headless GPUs need an "
                    "emulated monitor, or NVML fan control (driver ≥ 520, as root)" +
                    (f"; open-air cards side by side: {', '.join(sorted(set(open_air)))}" if open_air else ""))]


def _build(facts: dict, use_case: str | None, preprocessing: str):
    node = node_spec(facts)
    devices = facts["nvml"]["gpus"]
    groups: dict[str, int] = {}
    for d in devices:
        groups[gpu_of(d, facts["hostname"]).name] = groups.get(gpu_of(d, facts["hostname"]).name, 0) + 1
    ssd = sum(d["size_gb"] for d in facts["disks"] if d["kind"] == "ssd")
    hdd = sum(d["size_gb"] for d in facts["disks"] if d["kind"] == "hdd")
    data = {"gpus": [{"model": name, "count": n} for name, n in groups.items()], "ram_gb": node.ram_gb,
            "cpu": {k: v for k, v in dataclasses.asdict(node.cpu).items() if v is not None},
            "storage": {"ssd_gb": ssd, "hdd_gb": hdd},
            "usage": {"preprocessing": preprocessing, **({"use_case": use_case} if use_case else {})}}
    widths = [d["pcie_width"] for d in devices]
    if devices and all(widths):
        data["board"] = {"lanes": widths, **({"pcie_gen": node.pcie_gen} if node.pcie_gen else {}),
                         **{k: getattr(node, k) for k in ("sockets", "pcie_switches") if getattr(node, k)}}
    if devices and all(catalog_known(d) for d in devices):
        return build_from(data, "this machine")
    return None


def catalog_known(device: dict) -> bool:
    try:
        catalog.gpu(device["name"])
        return True
    except SpecError:
        return False


def gpu_checks(facts: dict) -> list[Verdict]:
    """What only a running GPU shows: narrow links, heat, throttling, peer-to-peer."""
    out = []
    for i, d in enumerate(facts["nvml"]["gpus"]):
        tag = f"GPU {i}"
        if d["pcie_width"] and d["pcie_width_max"] and d["pcie_width"] < d["pcie_width_max"]:
            out.append(Verdict(f"{tag} PCIe link", WARNING, f"x{d['pcie_width']} of x{d['pcie_width_max']}",
                               "the card runs narrower than it can: a narrow slot, a riser, or a bad seat"))
        else:
            out.append(Verdict(f"{tag} PCIe link", OK,
                               f"gen {d['pcie_gen']} (max {d['pcie_gen_max']}) x{d['pcie_width']}",
                               "an idle GPU lowers its link generation to save power; width is what counts"))
        temp = d["temperature_c"]
        hot = [r for r in (d["throttle_reasons"] or []) if "thermal" in r or "power brake" in r or "slowdown" in r]
        if temp is not None and temp >= HOT_C or hot:
            out.append(Verdict(f"{tag} heat", WARNING, f"{temp} °C" + (f", {', '.join(hot)}" if hot else ""),
                               "throttling at ~80 °C costs 0–10 % alone, 10–25 % with several GPUs"))
        else:
            out.append(Verdict(f"{tag} heat", OK, f"{temp} °C, {d['sm_clock_mhz']}/{d['sm_clock_max_mhz']} MHz",
                               "below the ~80 °C where GPUs throttle"))
    no_p2p = [p["gpus"] for p in facts["nvml"]["pairs"] if p["p2p"] is False]
    if facts["nvml"]["pairs"]:
        out.append(Verdict("peer-to-peer", WARNING if no_p2p else OK,
                           f"{len(no_p2p)} of {len(facts['nvml']['pairs'])} pairs without",
                           "GPU pairs without P2P copy through host memory (different chipsets, or across CPUs)"
                           if no_p2p else "every GPU pair copies directly"))
    return out


def machine_checks(facts: dict) -> list[Verdict]:
    """GPU presence, MPI and the network interfaces."""
    out = []
    nv = facts["nvml"]
    if not nv["gpus"]:
        out.append(Verdict("GPUs", INFO, "none", f"no GPU: {nv['reason']}; the CPU checks still apply"))
    else:
        names = sorted({d["name"] for d in nv["gpus"]})
        unknown = [n for n in names if not catalog_known({"name": n})]
        out.append(Verdict("GPUs", OK if not unknown else INFO, f"{len(nv['gpus'])} × {', '.join(names)}",
                           f"driver {nv.get('driver')}" + (f"; not in the catalog: {', '.join(unknown)}" if unknown else "")))
    m = facts["mpi"]
    if not m["present"]:
        out.append(Verdict("MPI", WARNING, "not found", f"mpi4py cannot load MPI ({m.get('error')}); "
                           "gpurig's MPI engine needs it (the torch engine does not)"))
    elif nv["gpus"] and not m["cuda_aware"]:
        out.append(Verdict("MPI", WARNING, f"{m['library']}, not CUDA-aware",
                           "GPU tensors are staged through host memory; the source recommends CUDA-aware MPI"))
    else:
        aware = "CUDA-aware" if m["cuda_aware"] else "not CUDA-aware (no GPU here, so no matter)"
        out.append(Verdict("MPI", OK, f"{m['library']}, {aware}", f"mpi4py {m['mpi4py']}"))
    speeds = [n["gbit_per_s"] for n in facts["nics"] if n["gbit_per_s"]]
    if not facts["nics"]:
        out.append(Verdict("network", INFO, "no interface up", "single machine only"))
    elif not speeds:
        out.append(Verdict("network", INFO, ", ".join(n["name"] for n in facts["nics"]) + ": speed unknown",
                           "the driver reports no link speed (virtual NIC); `gpurig bench` measures between ranks"))
    else:
        best = max(speeds)
        verdict = OK if best >= 40 else INFO
        out.append(Verdict("network", verdict, f"{best:g} Gbit/s",
                           "≥ 40 Gbit/s for data parallelism across nodes" if best >= 40 else
                           "fine for one machine; across nodes data parallelism wants ≥ 40 Gbit/s"))
    return out


def doctor(facts: dict | None = None, use_case: str | None = None, preprocessing: str = "during") -> dict:
    """The report: facts, verdicts (machine, GPU and build rules) and rules skipped.

    >>> report = doctor()
    >>> any(v["rule"] == "MPI" for v in report["verdicts"])
    True
    """
    facts = facts or probe()
    verdicts = machine_checks(facts) + gpu_checks(facts) + fan_checks(facts)
    skipped = []
    build = _build(facts, use_case, preprocessing)
    if build is not None:
        found, skipped = rules.check(build, MACHINE_RULES)
        verdicts += found
    else:
        verdicts += cpu_only_checks(facts)
        if use_case is not None:  # the use case is held against the GPUs' memory: there is none to hold it to
            skipped.append(rules.Skipped("GPU memory", f"a GPU the catalog knows, for --use-case {use_case}"))
    worst = max((rules.VERDICTS.index(v.verdict) for v in verdicts if v.verdict != INFO), default=0)
    return {"facts": facts, "verdicts": [dataclasses.asdict(v) for v in verdicts],
            "skipped": [dataclasses.asdict(s) for s in skipped], "overall": rules.VERDICTS[worst]}


def cpu_only_checks(facts: dict) -> list[Verdict]:
    """The rules that need no GPU: CPU clock, RAM, disks."""
    cpu = facts["cpu"]
    out = []
    if cpu["ghz"]:
        out.append(Verdict("CPU clock", OK if cpu["ghz"] > 2 else WARNING, f"{cpu['ghz']:g} GHz",
                           "> 2 GHz is enough; clock rate hardly matters"))
    out.append(Verdict("CPU threads", INFO, f"{cpu['threads']} threads, {cpu['cores']} cores",
                       f"enough to feed {cpu['threads'] // 4} GPU(s) preprocessing during training, "
                       f"{cpu['threads'] // 2} preprocessing before (4 / 2 threads per GPU)"))
    out.append(Verdict("RAM size", INFO, f"{facts['ram_gb']:g} GB",
                       f"enough for GPUs of up to {facts['ram_gb']:g} GB (RAM ≥ the largest GPU's memory)"))
    kinds = {d["kind"] for d in facts["disks"]}
    out.append(Verdict("storage", OK if "ssd" in kinds else INFO,
                       ", ".join(f"{d['name']} {d['kind'].upper()} {d['size_gb']:g} GB" for d in facts["disks"]) or "none",
                       "an SSD for comfort, a large HDD for data" +
                       ("; a virtual disk reports whatever its host set (rotational flag)" if "ssd" not in kinds else "")))
    return out


def write_spec(facts: dict, path: str) -> ClusterSpec:
    """Write this machine as a one-node cluster spec to ``path``; return it."""
    spec = ClusterSpec(nodes=(node_spec(facts),), name=f"{facts['hostname']} (gpurig doctor)")
    save_spec(spec, path, header=f"gpurig cluster spec of {facts['hostname']}, written by gpurig doctor\n"
                                 "read by gpurig plan --spec (and gpurig predict); see docs/hardware.md")
    return spec


__all__ = ["probe", "doctor", "write_spec", "node_spec", "spec_to_dict"]
