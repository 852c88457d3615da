"""How a board wires its GPUs: lanes split from the CPUs as boards split them, the network card's lanes, PCIe
switches and sockets — and what a hop between two GPUs crosses, priced for ``gpurig predict``.

The multi-GPU post and the guide's replies: one CPU's 40 lanes run 16/8/8/8 for 4 devices or 16/16/8 for 3, at
most 4 devices per CPU (a 3-GPU + InfiniBand node: the card takes lanes too, 8x8x8x16); GPUs of two sockets
pass their data through host memory across the CPUs' interconnect ("the GPU pairs will communicate through CPU
memory"); GPUs behind one PCIe switch (PLX) talk to each other directly, and share the switch's x16 uplink to the
CPU. GPUs are spread evenly over sockets and switches and ranks fill them in order.
"""

from __future__ import annotations

import math

from gpurig.perf.collectives import Link
from gpurig.perf.transfer import pcie_bytes_per_s

WIDTHS = (16, 8, 4, 2, 1)
DEVICES_PER_CPU = 4        # "40 PCIe lanes often equals to active 4 PCIe slots"
SWITCH_UPLINK_LANES = 16   # a PLX switch hangs off one x16 port of the CPU
NIC_GEN = "3.0"            # the generation an add-in network card is sized for


def split_lanes(cpu_lanes: int, devices: int) -> list[int]:
    """Lanes each device gets from one CPU, as boards split them: the widest even width, then x16 from the first
    slot on while lanes remain.

    >>> split_lanes(40, 4), split_lanes(40, 3), split_lanes(28, 2), split_lanes(16, 2), split_lanes(40, 8)
    ([16, 8, 8, 8], [16, 16, 8], [16, 8], [8, 8], [8, 8, 4, 4, 4, 4, 4, 4])
    """
    if devices <= 0:
        return []
    base = next((w for w in WIDTHS if w * devices <= cpu_lanes), 0)
    widths, left = [base] * devices, cpu_lanes - base * devices
    for i in range(devices):
        while 0 < widths[i] < 16 and left >= widths[i]:
            left -= widths[i]
            widths[i] *= 2
    return widths


def spread(items: int, groups: int) -> list[int]:
    """``items`` spread as evenly as a board spreads its GPUs over ``groups`` sockets or switches, fullest first.

    >>> spread(8, 2), spread(3, 2), spread(1, 2)
    ([4, 4], [2, 1], [1, 0])
    """
    groups = max(1, groups)
    return [items // groups + (1 if i < items % groups else 0) for i in range(groups)]


def nic_lanes(data_gbit_per_s: float | None) -> int:
    """Lanes an add-in network card takes from the CPU: the narrowest PCIe 3.0 link that carries its data rate
    (0 below 10 Gbit/s: onboard Ethernet hangs off the chipset).

    >>> nic_lanes(54.5), nic_lanes(32), nic_lanes(100), nic_lanes(10), nic_lanes(1), nic_lanes(None)
    (8, 8, 16, 2, 0, 0)
    """
    if not data_gbit_per_s or data_gbit_per_s < 10:
        return 0
    need = data_gbit_per_s * 1e9 / 8
    return next((w for w in reversed(WIDTHS) if pcie_bytes_per_s(NIC_GEN, w) >= need), 16)


def hop(gpus: int, ranks: int, sockets: int | None, switches: int | None, nvlink: bool = False) -> str:
    """The slowest hop a ring over the first ``ranks`` of a node's ``gpus`` crosses: ``nvlink``, ``switch`` (GPUs
    behind one PCIe switch), ``pcie`` (through one CPU's root complex) or ``sockets`` (through host memory
    across the CPUs' interconnect).

    >>> hop(8, 4, 2, 2), hop(8, 8, 2, 2), hop(4, 4, None, None), hop(4, 4, 2, 0)
    ('switch', 'sockets', 'pcie', 'sockets')
    """
    if ranks <= 1:
        return "none"
    if nvlink:
        return "nvlink"
    if sockets and sockets > 1 and ranks > spread(gpus, sockets)[0]:
        return "sockets"
    if switches and ranks <= spread(gpus, switches)[0]:
        return "switch"
    return "pcie"


def hop_link(kind: str, pcie: Link) -> Link:
    """What one GPU-to-GPU hop of ``kind`` delivers, from the GPUs' own PCIe ``pcie`` link.

    Across sockets the data is copied GPU → host memory → GPU, one copy after the other (no peer-to-peer
    across the CPUs' link): twice the latency and half the rate — the guide's "about 4 GB/s" on PCIe 3.0.

    >>> l = hop_link("sockets", Link(5e-6, 8e9))
    >>> l.latency_s, round(l.bytes_per_s / 1e9, 2)
    (1e-05, 4.0)
    """
    if kind == "sockets":
        return Link(2 * pcie.latency_s, 1.0 / (2 * pcie.beta))
    return pcie


def cpu_devices(gpus: int, sockets: int | None, switches: int | None, nic: bool) -> list[int]:
    """Devices on each CPU's lanes: its GPUs (or the switches they sit behind) and, on the first, the NIC.

    >>> cpu_devices(3, None, None, True), cpu_devices(8, 2, 2, False), cpu_devices(8, 1, None, False)
    ([4], [1, 1], [8])
    """
    per_socket = spread(switches if switches else gpus, sockets or 1)
    per_socket[0] += int(nic)
    return per_socket


def lanes_needed(gpu_lanes: list[int], sockets: int | None, switches: int | None, nic: int) -> list[int]:
    """Lanes each CPU must give: its GPUs' (or its switches' x16 uplinks) and, on the first, the NIC's.

    >>> lanes_needed([16, 16, 16, 16], None, None, 0), lanes_needed([16] * 8, 2, 2, 8)
    ([64], [24, 16])
    """
    if switches:
        per = [SWITCH_UPLINK_LANES * n for n in spread(switches, sockets or 1)]
    else:
        sizes, out, i = spread(len(gpu_lanes), sockets or 1), [], 0
        for size in sizes:
            out.append(sum(gpu_lanes[i:i + size]))
            i += size
        per = out
    per[0] += nic
    return per


def board_lanes(gpus: int, cpu_lanes: int, sockets: int | None, switches: int | None, nic: int,
                gpu_width: int = 16) -> list[int]:
    """Lanes each GPU gets when the board splits each CPU's ``cpu_lanes`` (GPUs behind a switch get their own
    width, sharing the uplink).

    >>> board_lanes(4, 40, None, None, 0), board_lanes(3, 40, None, None, 8), board_lanes(8, 40, 2, 2, 0)
    ([16, 8, 8, 8], [16, 8, 8], [16, 16, 16, 16, 16, 16, 16, 16])
    """
    if switches:
        return [gpu_width] * gpus
    out = []
    for s, count in enumerate(spread(gpus, sockets or 1)):
        widths = split_lanes(cpu_lanes, count + (1 if s == 0 and nic else 0))
        out += [min(w, gpu_width) for w in widths[:count]]
    return out


def describe_wiring(sockets: int | None, switches: int | None) -> str:
    """A few words for the wiring, as plan and doctor print it.

    >>> describe_wiring(2, 2), describe_wiring(None, None)
    ('2 sockets, 2 PCIe switches', 'one CPU')
    """
    parts = ([f"{sockets} sockets"] if sockets and sockets > 1 else []) + \
        ([f"{switches} PCIe switch{'es' if switches > 1 else ''}"] if switches else [])
    return ", ".join(parts) or "one CPU"


def ceil_div(a: int, b: int) -> int:
    """``a / b`` rounded up.

    >>> ceil_div(7, 2)
    4
    """
    return math.ceil(a / b)
