"""CPU, RAM, disks and network interfaces, from /proc, /sys and psutil."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import psutil


def cpu() -> dict:
    """Model, physical cores, threads, and maximum clock of this machine's CPU.

    >>> info = cpu(); info["threads"] >= 1
    True
    """
    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    freq = None
    try:
        f = psutil.cpu_freq()
        freq = (f.max or f.current) / 1000 if f else None
    except (OSError, NotImplementedError, AttributeError):
        pass
    return {"model": model, "cores": psutil.cpu_count(logical=False) or os.cpu_count() or 1,
            "threads": psutil.cpu_count(logical=True) or 1, "ghz": round(freq, 2) if freq else None}


def ram_gb() -> float:
    """Total memory in GB as RAM is sold (2^30 bytes per "GB"); the kernel keeps a little for itself.

    >>> ram_gb() > 0
    True
    """
    return round(psutil.virtual_memory().total / 2**30, 1)


def disks(sys_block: str = "/sys/block") -> list[dict]:
    """Whole block devices (no partitions, loops or RAM disks): name, SSD or HDD, size in GB.

    ``queue/rotational`` is 1 for spinning disks and 0 for SSDs (virtual disks usually say 0 or 1
    as their host set them up).

    >>> isinstance(disks(), list)
    True
    """
    out = []
    root = Path(sys_block)
    if not root.is_dir():
        return out
    for dev in sorted(root.iterdir()):
        if dev.name.startswith(("loop", "ram", "zram", "dm-", "md", "sr", "fd", "nbd")):
            continue
        try:
            sectors = int((dev / "size").read_text())
            rotational = (dev / "queue" / "rotational").read_text().strip() == "1"
        except (OSError, ValueError):
            continue
        if sectors == 0:
            continue
        out.append({"name": dev.name, "kind": "hdd" if rotational else "ssd",
                    "size_gb": round(sectors * 512 / 1e9, 1)})
    return out


def nics(sys_net: str = "/sys/class/net") -> list[dict]:
    """Network interfaces that are up (loopback left out): name and link speed in Gbit/s (None if unknown).

    >>> all("name" in n for n in nics())
    True
    """
    out = []
    try:
        stats = psutil.net_if_stats()
    except OSError:
        stats = {}
    for name, st in sorted(stats.items()):
        if name == "lo" or not st.isup:
            continue
        speed = st.speed or None   # Mbit/s; 0 when the driver does not say (veth, many VMs)
        if speed is None:
            try:
                value = int((Path(sys_net) / name / "speed").read_text())
                speed = value if value > 0 else None
            except (OSError, ValueError):
                pass
        out.append({"name": name, "gbit_per_s": speed / 1000 if speed else None,
                    "kind": _rdma_kind(Path(sys_net) / name, name)})
    return out


def _rdma_kind(interface: Path, name: str) -> str | None:
    """"infiniband" or "roce" for an interface with an RDMA device (its ports' link layer says which), else None."""
    ports = sorted((interface / "device" / "infiniband").glob("*/ports/*/link_layer"))
    for port in ports:
        try:
            return "roce" if port.read_text().strip().lower() == "ethernet" else "infiniband"
        except OSError:
            continue
    return "infiniband" if name.startswith("ib") or (interface / "device" / "infiniband").exists() else None
