"""The hardware guide's rules, each a function of a :class:`~gpurig.spec.build.Build` giving a verdict.

``gpurig plan`` applies them to a parts list and ``gpurig doctor`` to this
machine. Every number comes from a formula in :mod:`gpurig.perf`; the
thresholds are the guide's (SEEDS.md, "Hardware rules"). A rule whose inputs
are missing is skipped and says what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.hardware import reference, topology
from gpurig.perf import power, transfer
from gpurig.perf.precision import precision_on
from gpurig.spec.build import USE_CASES, Build
from gpurig.spec.cluster import too_many_gpus
from gpurig.spec.hardware import connector_counts
from gpurig.units import BINARY, tensor_bytes

OK, WARNING, PROBLEM, INFO = "ok", "warning", "problem", "info"
VERDICTS = (OK, WARNING, PROBLEM, INFO)
THREADS_PER_GPU = {"during": 4, "before": 2}     # preprocessing while training / before training
ASSUMED_CPU_TDP_W = 150                            # the guide's example CPU, when none is given
IMAGENET_BATCH = (32, 225, 225, 3)                 # the guide's example mini-batch (fp32)
GUIDE_STEP_MS = 216                                # the guide's ResNet-152 forward + backward on its GPU
FULL_LENGTH_MM = 312                               # PCIe CEM full-length card (the guide: "fits full length GPUs")
EIGHT_PIN_PER_16PIN = {450: 3, 600: 4}             # 8-pin plugs a 12VHPWR adapter takes, by the card's watts


@dataclass(frozen=True)
class Verdict:
    """One rule's outcome: ok, warning, problem (or info: a number to buy by, nothing to check against)."""

    rule: str
    verdict: str
    number: str
    reason: str
    node: str | None = None   # which kind of machine, in a cluster of several kinds


@dataclass(frozen=True)
class Skipped:
    rule: str
    needs: str
    node: str | None = None


def _gpu_names(build: Build) -> str:
    return " + ".join(f"{g.count} × {g.gpu.name}" for g in build.gpus)


def gpu_memory(build: Build):
    """GPU memory against the use case (≥ 11 GB for state-of-the-art research …); 16-bit doubles what fits
    (16-bit storage halves every activation, fast 16-bit arithmetic or not); its speed is ``predict``'s."""
    if build.usage.use_case is None:
        return Skipped("GPU memory", "--use-case")
    need = USE_CASES[build.usage.use_case]
    smallest = min((g.gpu for g in build.gpus), key=lambda g: g.memory_gb)
    factor = 2 if build.usage.fp16 else 1
    usable = smallest.memory_gb * factor
    how = f"{smallest.memory_gb:g} GB" + (" × 2 with 16-bit training" if factor == 2 else "")
    if build.usage.fp16:
        how += f" ({sixteen_bit_speed(smallest)})"
    verdict = OK if usable >= need else PROBLEM
    return Verdict("GPU memory", verdict, f"{usable:g} GB (need ≥ {need} GB)",
                   f"{build.usage.use_case} needs ≥ {need} GB; {smallest.name}: {how}")


def sixteen_bit_speed(gpu) -> str:
    """What 16-bit training does to a GPU's speed, in ``predict``'s terms (its precision note, its step times).

    >>> from gpurig.spec import catalog
    >>> sixteen_bit_speed(catalog.gpu("V100")).startswith("ResNet-152 steps")
    True
    """
    fp32 = reference.compute_seconds(gpu)
    fp16 = reference.compute_seconds(gpu, precision="fp16")
    note = precision_on(gpu, "fp16").note
    return f"ResNet-152 steps {fp32 / fp16:.2f}x as fast in 16-bit" + (f"; {note}" if note else "")


def mixed_gpus(build: Build):
    """Different GPU models in a machine or across the cluster: data parallelism runs at the slowest one's pace."""
    models = {g.gpu.name for m in build.machines() for g in m.gpus}
    names = "; ".join(_gpu_names(m) for m in build.machines())
    if len(models) == 1:
        return Verdict("GPU models", OK, names, "one model: every rank computes at the same pace")
    slowest = max(models, key=lambda name: reference.compute_seconds(
        next(g.gpu for m in build.machines() for g in m.gpus if g.gpu.name == name)))
    return Verdict("GPU models", WARNING, f"{len(models)} models", f"{names}: data parallelism waits for the slowest "
                   f"GPU each step ({slowest}); GPUs of different chipsets cannot copy peer-to-peer")


def cpu_tdp(build: Build) -> float:
    return build.cpu.tdp_w if build.cpu is not None and build.cpu.tdp_w is not None else ASSUMED_CPU_TDP_W


def psu_watts_rule(build: Build):
    """PSU watts: (GPU TDPs + CPU TDP) × 1.1, rounded up to the next 50 W."""
    tdps = [g.tdp_w or 0 for g in build.each_gpu()]
    need = power.psu_watts(tdps, cpu_tdp(build))
    size = power.psu_size(need)
    load = sum(tdps) + cpu_tdp(build)
    assumed = "" if build.cpu is not None and build.cpu.tdp_w is not None else \
        f" (CPU TDP assumed {ASSUMED_CPU_TDP_W} W: give --cpu-tdp)"
    formula = f"({sum(tdps):g} W GPUs + {cpu_tdp(build):g} W CPU) × 1.1 = {need:.0f} W{assumed}"
    have = build.psu.watts
    if have is None:
        return Verdict("PSU watts", INFO, f"buy ≥ {size} W", formula)
    if have >= need:
        return Verdict("PSU watts", OK, f"{have:g} W ≥ {need:.0f} W", formula)
    if have >= load:
        return Verdict("PSU watts", WARNING, f"{have:g} W < {need:.0f} W",
                       f"{formula}: no 10 % margin for power spikes; buy ≥ {size} W")
    return Verdict("PSU watts", PROBLEM, f"{have:g} W < {load:g} W load", f"{formula}; buy ≥ {size} W")


def connectors_needed(build: Build) -> dict[str, int]:
    """PCIe power plugs the GPUs need, in 8-pin terms where adapters convert (12-pin = 2 × 8, 16-pin kept)."""
    need = {"6": 0, "8": 0, "16": 0, "8cpu": 0, "unknown": 0}
    for gpu in build.each_gpu():
        if gpu.power_connectors is None:
            need["unknown"] += 1
            continue
        for kind, n in connector_counts(gpu.power_connectors, gpu.name).items():
            if kind == "12":       # 30-series Founders Editions ship a 12-pin to 2 × 8-pin adapter
                need["8"] += 2 * n
            else:
                need[kind] += n
    return need


def power_connectors(build: Build):
    """Enough 6/8-pin (and 16-pin) PCIe connectors on the PSU; an 8-pin (6+2) also feeds a 6-pin socket."""
    need = connectors_needed(build)
    wanted = ", ".join(f"{n} × {k.replace('8cpu', 'EPS 8')}-pin" for k, n in need.items() if n and k != "unknown")
    if need["unknown"] and not wanted:
        return Skipped("power connectors", "GPUs whose connectors the catalog knows")
    psu = build.psu
    if psu.pcie_6pin is None and psu.pcie_8pin is None and psu.pcie_16pin is None and psu.eps_8pin is None:
        return Verdict("power connectors", INFO, wanted or "none", "the PSU must have these for the GPUs")
    have6, have8, have16, eps = (psu.pcie_6pin or 0), (psu.pcie_8pin or 0), (psu.pcie_16pin or 0), (psu.eps_8pin or 0)
    spare8 = have8 - need["8"]
    missing16 = max(0, need["16"] - have16)
    big = max((g.tdp_w or 0 for g in build.each_gpu() if (g.power_connectors or "").endswith("x16")), default=0)
    per_adapter = EIGHT_PIN_PER_16PIN[450] if big <= 450 else EIGHT_PIN_PER_16PIN[600]
    spare8 -= missing16 * per_adapter
    spare8 -= max(0, need["6"] - have6)
    have = f"PSU: {have6} × 6-pin, {have8} × 8-pin, {have16} × 16-pin" + (f", {eps} × EPS 8-pin" if need["8cpu"] else "")
    if spare8 < 0 or eps < need["8cpu"] and need["8cpu"]:
        return Verdict("power connectors", PROBLEM, f"need {wanted}", f"{have}: not enough")
    if missing16:
        return Verdict("power connectors", WARNING, f"need {wanted}",
                       f"{have}: {missing16} card(s) need a 16-pin adapter from {per_adapter} × 8-pin")
    return Verdict("power connectors", OK, f"need {wanted}", have)


def ram_size(build: Build):
    """RAM ≥ the largest GPU's memory (more GPUs need no more RAM)."""
    if build.ram_gb is None:
        return Skipped("RAM size", "--ram-gb")
    largest = max(g.memory_gb for g in build.each_gpu())
    verdict = OK if build.ram_gb >= largest else WARNING
    return Verdict("RAM size", verdict, f"{build.ram_gb:g} GB (need ≥ {largest:g} GB)",
                   "at least the largest GPU's memory, to work without swapping; more GPUs need no more "
                   "(the 2014 post asked 2×); clock speed does not matter")


def cpu_threads(build: Build):
    """CPU threads per GPU: ≥ 4 when preprocessing during training, ≥ 2 when data is preprocessed before."""
    if build.cpu is None or not (build.cpu.threads or build.cpu.cores):
        return Skipped("CPU threads", "--cpu-cores or --cpu-threads")
    per_gpu = THREADS_PER_GPU[build.usage.preprocessing]
    threads = build.cpu.threads or build.cpu.cores
    need = per_gpu * build.gpu_count
    reason = f"preprocessing {build.usage.preprocessing} training: ≥ {per_gpu} threads per GPU"
    if threads >= need:
        return Verdict("CPU threads", OK, f"{threads} (need ≥ {need})", reason)
    if threads >= build.gpu_count:
        return Verdict("CPU threads", WARNING, f"{threads} (need ≥ {need})",
                       f"{reason}; each extra core per GPU gains about 0–5 %")
    return Verdict("CPU threads", PROBLEM, f"{threads} (need ≥ {need})", f"{reason}; fewer threads than GPUs")


def cpu_clock(build: Build):
    """CPU clock > 2 GHz (beyond that it hardly matters)."""
    if build.cpu is None or build.cpu.ghz is None:
        return Skipped("CPU clock", "--cpu-ghz")
    verdict = OK if build.cpu.ghz > 2 else WARNING
    return Verdict("CPU clock", verdict, f"{build.cpu.ghz:g} GHz", "> 2 GHz is enough; clock rate hardly matters")


def _nic_lanes(build: Build) -> int:
    """Lanes the network card takes from the CPU: nodes of a cluster each have one."""
    if (build.cluster_nodes or build.node_count) < 2 or build.network is None:
        return 0
    return topology.nic_lanes(build.network.data_gbit_per_s)


def gpu_lanes(build: Build) -> list[int] | None:
    """Lanes each GPU gets: the board's list, else the CPUs' lanes split as boards split them (16/8/8/8, 16/16/8),
    the network card's lanes counted, GPUs behind a PCIe switch at their own width.

    >>> from gpurig.spec.build import build_from
    >>> gpu_lanes(build_from({"gpus": [{"model": "2080ti", "count": 4}], "cpu": {"cores": 8, "pcie_lanes": 40}}, "x"))
    [16, 8, 8, 8]
    """
    n = build.gpu_count
    if build.board.lanes:
        return list(build.board.lanes[:n])
    if build.cpu is not None and build.cpu.pcie_lanes:
        width = min((g.pcie_lanes or 16) for g in build.each_gpu())
        return topology.board_lanes(n, build.cpu.pcie_lanes, build.board.sockets, build.board.pcie_switches,
                                    _nic_lanes(build), width)
    return None


def copy_ms(gen: str, lanes: int, pinned: bool = False) -> float:
    """The guide's ImageNet batch (32 × 225 × 225 × 3, fp32) copied to the GPU: pinned at PCIe's rate, pageable at
    half of it ("in practice you often see PCIe be twice as slow").

    >>> round(copy_ms("3.0", 16, pinned=True), 2), round(copy_ms("3.0", 4), 2)
    (1.15, 9.19)
    """
    rate = transfer.quoted_rate_bytes_per_s(transfer.pcie_gbytes_per_s(gen, lanes), "GB/s", base=BINARY)
    return 1e3 * transfer.transfer_seconds(tensor_bytes(IMAGENET_BATCH), rate,
                                           efficiency=transfer.host_copy_efficiency(pinned))


def lane_gain(step_ms: float, gen: str, narrow: int, wide: int = 16) -> float:
    """What going from ``narrow`` to ``wide`` lanes saves of a step that copies its batch from pageable memory
    (the guide: x4 → x16 on a 216 ms ResNet-152 step, about 3.2 %; 0 % with pinned-memory prefetch).

    >>> round(lane_gain(216, "3.0", 4), 4)
    0.0319
    """
    return (copy_ms(gen, narrow) - copy_ms(gen, wide)) / step_ms


def pcie_lanes(build: Build):
    """PCIe lanes: hardly matter for 1–3 GPUs; with 4 GPUs want 8 lanes each (32 in all); what the board asks of
    the CPUs (the NIC's lanes too) must be there, and one CPU drives at most 4 devices."""
    lanes = gpu_lanes(build)
    if lanes is None:
        return Skipped("PCIe lanes", "--lanes or --cpu-lanes")
    n = build.gpu_count
    board = build.board
    nic = _nic_lanes(build)
    shown = "/".join(map(str, lanes)) + (f" + NIC x{nic}" if nic else "")
    if len(lanes) < n or min(lanes) == 0:
        return Verdict("PCIe lanes", PROBLEM, shown or "0", f"the board / CPU cannot give all {n} GPUs a link")
    wiring = topology.describe_wiring(board.sockets, board.pcie_switches)
    if build.cpu is not None and build.cpu.pcie_lanes:
        need = topology.lanes_needed(lanes, board.sockets, board.pcie_switches, nic)
        have = build.cpu.pcie_lanes
        if max(need) > have:
            return Verdict("PCIe lanes", PROBLEM, f"{shown}: {max(need)} lanes of a {have}-lane CPU",
                           f"the GPUs{' and the network card' if nic else ''} need {'+'.join(map(str, need))} lanes "
                           f"({wiring}); each CPU gives {have}: fewer lanes per GPU, a PCIe switch or a second CPU")
    devices = topology.cpu_devices(n, board.sockets, board.pcie_switches, bool(nic))
    if max(devices) > topology.DEVICES_PER_CPU:
        return Verdict("PCIe lanes", PROBLEM, f"{shown}: {max(devices)} devices on one CPU",
                       f"a CPU's lanes drive at most {topology.DEVICES_PER_CPU} devices (16/8/8/8 or 16/16/8): "
                       "more GPUs need a second CPU or PCIe switches, or a second machine")
    gen = link_generation(build)
    worst = min(lanes)
    slowest = _slowest_gpu(build)
    step_ms = 1e3 * reference.compute_seconds(slowest)
    number = f"{shown} (x{worst}: {copy_ms(gen, worst, pinned=True):.2f} ms per ImageNet batch)"
    share = (f"copied from pageable memory (half PCIe's rate) the batch takes {copy_ms(gen, worst) / step_ms:.1%} of "
             f"a {step_ms:.0f} ms ResNet-152 step on the {slowest.name} (the guide's GPU: {GUIDE_STEP_MS} ms), "
             "0 % with pinned-memory prefetch")
    if board.pcie_switches:
        share += f"; GPUs behind a switch share its x{topology.SWITCH_UPLINK_LANES} uplink to the CPU"
    if n >= 4 and worst < 8:
        return Verdict("PCIe lanes", WARNING, number, f"with {n} GPUs give each ≥ 8 lanes ({8 * n} in all); {share}")
    return Verdict("PCIe lanes", OK, number,
                   f"PCIe {gen}, {wiring}; {'hardly matters for 1–3 GPUs' if n < 4 else '≥ 8 lanes each'}; {share}")


def link_generation(build: Build) -> str:
    """The PCIe generation the GPUs' links run at: the lower of the board's and the oldest GPU's (a PCIe 3.0 card
    in a 5.0 slot runs at 3.0); a GPU described without one takes the board's, and with neither known, 3.0.

    >>> from gpurig.hardware.plan import inputs
    >>> old_card = inputs(description="4 x RTX 2080 Ti", flags={"board": {"pcie_gen": "5.0"}})   # a 3.0 card
    >>> link_generation(old_card), link_generation(inputs(description="2 x RTX 4090"))
    ('3.0', '4.0')
    """
    return transfer.slower_link((build.board.pcie_gen, *(g.pcie_gen for g in build.each_gpu())), ())[0]


def _slowest_gpu(build: Build):
    models = list({g.gpu.name: g.gpu for g in build.gpus}.values())
    return models[0] if len(models) == 1 else max(models, key=reference.compute_seconds)


def pcie_generation(build: Build):
    """PCIe 3.0 for several GPUs: PCIe 2.0 costs a data-parallel net about 15 % at 2 GPUs (more at 3–4); the cost
    is ``predict``'s, on these GPUs and lanes. Across sockets GPU pairs copy through host memory."""
    board = build.board
    gen = link_generation(build)
    n = build.gpu_count
    lanes = gpu_lanes(build) or [min(g.pcie_lanes or 16 for g in build.each_gpu())] * n
    worst = min(lanes) if lanes else 16
    cross = ""
    if board.sockets and board.sockets > 1 and n > 1:
        cross = ("; GPUs on different sockets copy through host memory across the CPUs' link (half the rate): "
                 "for 4 GPUs one CPU is better")
    if n < 2:
        return Verdict("PCIe generation", OK, f"PCIe {gen}", "one GPU: the generation costs 0–5 % (host copies only)")
    if float(gen) >= 3:
        return Verdict("PCIe generation", WARNING if cross else OK, f"PCIe {gen}",
                       f"PCIe 3.0 or later for {n} GPUs{cross}")
    slowest = _slowest_gpu(build)
    cost = reference.generation_cost(slowest, n, gen, worst)
    return Verdict("PCIe generation", WARNING, f"PCIe {gen}: +{cost:.0%} per step",
                   f"{n} × {slowest.name} averaging AlexNet's gradients (batch 128 each) over PCIe {gen} x{worst}: "
                   f"{cost:.0%} longer steps than on PCIe 3.0 (the guide: ~15 % for a second GPU, more for a "
                   f"third and fourth){cross}")


def _adjacent(build: Build) -> bool:
    """Whether the GPUs sit with no free slot between them."""
    widths = [g.slot_width or 2 for g in build.each_gpu()]
    if build.board.gpu_slots is not None and build.gpu_count <= build.board.gpu_slots // 2:
        return False  # e.g. 2 GPUs on a 4-GPU board: a free slot between them
    if build.board.slot_pitch is not None:
        return build.board.slot_pitch <= max(widths)
    return build.gpu_count >= 3


def cooling(build: Build):
    """Cooling: blower or water cooling for 3–4 adjacent GPUs; expected throttling loss."""
    coolers = {g.cooling for g in build.gpus}
    n = build.gpu_count
    if "water" in coolers and len(coolers) == 1:
        return Verdict("cooling", OK, "no throttling",
                       f"water cooling: about $100 per GPU + $50 (≈ ${100 * n + 50}); a radiator per GPU to fit")
    if n == 1:
        return Verdict("cooling", OK, "0–10 % throttling", "one GPU: air cooling is best; it throttles at ~80 °C")
    if not _adjacent(build):
        return Verdict("cooling", OK, "10–25 % throttling",
                       "GPUs with space between them are fine on air; they heat each other a little")
    if "open" in coolers:
        return Verdict("cooling", PROBLEM, "~30 % slower",
                       "non-blower (open-air) cards side by side recirculate hot air, throttle and die sooner: "
                       "get blower-style cards or water cooling")
    if "passive" in coolers:
        return Verdict("cooling", WARNING, "needs server airflow",
                       "passive data-center cards need a server chassis' forced airflow")
    return Verdict("cooling", OK, "10–15 % throttling", "blower-style fans push the heat out of the case")


def case(build: Build):
    """The case: fits full-length cards and, with water cooling, a radiator per GPU; a big case for cooling gains
    only 2–5 °C (the card's cooler decides)."""
    length, mounts = build.case.gpu_length_mm, build.case.radiators
    if length is None and mounts is None:
        return Skipped("case", "--case-gpu-mm / --case-radiators")
    water = sum(g.count for g in build.gpus if g.cooling == "water")
    problems = []
    if length is not None and length < FULL_LENGTH_MM:
        problems.append(f"takes cards up to {length:g} mm: full-length cards are up to {FULL_LENGTH_MM} mm "
                        "(check your card's length)")
    if water and (mounts or 0) < water:
        problems.append(f"{count(mounts or 0, 'radiator mount')} for {count(water, 'water-cooled GPU')} (one radiator each)")
    number = ", ".join(([f"{length:g} mm cards"] if length is not None else []) +
                       ([count(mounts, "radiator")] if mounts is not None else []))
    note = "a bigger case gains only 2–5 °C: buy it to fit the parts, not to cool them"
    if problems:
        return Verdict("case", PROBLEM if water and (mounts or 0) < water else WARNING, number,
                       "; ".join(problems) + f"; {note}")
    return Verdict("case", OK, number, f"fits full-length cards{' and the radiators' if water else ''}; {note}")


def count(n: int, noun: str) -> str:
    """``n`` of ``noun``, plural but for one.

    >>> count(1, "module"), count(4, "slot")
    ('1 module', '4 slots')
    """
    return f"{n} {noun}{'' if n == 1 else 's'}"


def slots(build: Build):
    """Board slots: one x16-size slot per GPU, double-width spacing; usually 4 GPUs at most."""
    n = build.gpu_count
    width = max(g.slot_width or 2 for g in build.each_gpu())
    modules = [g.name for g in build.each_gpu() if g.form_factor in ("sxm", "oam")]
    if modules:
        return Verdict("board slots", WARNING, count(len(modules), "module"),
                       f"{modules[0]} is an {build.each_gpu()[0].form_factor.upper()} module for a server board "
                       "(HGX/OAM), not a PCIe card")
    if build.board.gpu_slots is None and too_many_gpus(n):
        return Verdict("board slots", PROBLEM, f"{n} GPUs in one machine",
                       too_many_gpus(n, "..., NETWORK"))
    if build.board.gpu_slots is None:
        return Verdict("board slots", INFO, f"{count(n, 'slot')}, {width} apart",
                       f"{count(n, 'x16-size slot')} spaced for {width}-slot-wide cards" +
                       ("; more than 4 GPUs rarely fit one board" if n > 4 else ""))
    if build.board.gpu_slots < n:
        return Verdict("board slots", PROBLEM, f"{build.board.gpu_slots} < {n}", "not enough GPU slots")
    if build.board.slot_pitch is not None and build.board.slot_pitch < width:
        # each card covers the slots under it: every ``step``-th slot takes one (two 3-slot cards in slots 1 and 3
        # of a 4-slot board spaced 2 apart)
        step = -(-width // build.board.slot_pitch)
        room = -(-build.board.gpu_slots // step)
        if room < n:
            return Verdict("board slots", PROBLEM, f"{width}-slot cards, slots {build.board.slot_pitch} apart",
                           f"each card covers the next slot: {count(room, 'card')} fit")
        return Verdict("board slots", OK, f"{count(build.board.gpu_slots, 'slot')} for {n}",
                       f"{width}-slot cards in every {'other' if step == 2 else f'{step}th'} slot")
    if n > 4:
        return Verdict("board slots", WARNING, f"{n} GPUs", "boards usually support 4 GPUs at most")
    return Verdict("board slots", OK, f"{count(build.board.gpu_slots, 'slot')} for {n}", f"{width}-slot cards fit")


def storage(build: Build):
    """Disk: an SSD for comfort, a large HDD (≥ 3 TB) for data; loading asynchronously hides either."""
    ssd, hdd = build.storage.ssd_gb, build.storage.hdd_gb
    if ssd is None and hdd is None:
        return Skipped("storage", "--ssd-gb / --hdd-gb")
    disk_ms = 1e3 * transfer.transfer_seconds(tensor_bytes(IMAGENET_BATCH),
                                              transfer.quoted_rate_bytes_per_s(100, "MB/s", base=BINARY))
    note = f"a 100 MB/s disk loads an ImageNet batch in {disk_ms:.0f} ms: prefetch it asynchronously"
    if not ssd:
        return Verdict("storage", WARNING, f"HDD {hdd or 0:g} GB, no SSD", f"an SSD for comfort; {note}")
    if (hdd or 0) < 3000:
        return Verdict("storage", INFO, f"SSD {ssd:g} GB, HDD {hdd or 0:g} GB", f"a ≥ 3 TB HDD for data; {note}")
    return Verdict("storage", OK, f"SSD {ssd:g} GB, HDD {hdd:g} GB", note)


def system_draw_w(build: Build) -> float:
    """Watts one machine's parts draw at full load: GPU TDPs + CPU TDP, unless a measured draw is given."""
    if build.usage.draw_w is not None:
        return build.usage.draw_w
    return sum(g.tdp_w or 0 for g in build.each_gpu()) + cpu_tdp(build)


def cluster_draw_w(build: Build) -> float:
    """Watts every machine of the cluster draws, each kind times its count (a 3 + 1 of GTX Titans: 1300 W).

    >>> from gpurig.spec.build import build_from
    >>> cluster_draw_w(build_from({"gpus": [{"model": "GTX Titan", "count": 3}],
    ...                            "other_nodes": [{"gpus": [{"model": "GTX Titan"}]}]}, "x"))
    1300.0
    """
    return float(sum(system_draw_w(m) * m.nodes for m in build.machines()))


def energy(build: Build):
    """Energy for the run: kWh and money at the price per kWh, behind the PSU's efficiency."""
    usage = build.usage
    if usage.hours is None:
        return Skipped("energy", "--hours")
    watts = cluster_draw_w(build)
    efficiency = build.psu.efficiency or 1.0
    kwh = power.wall_energy_kwh(watts, usage.hours, efficiency)
    number = f"{kwh:.0f} kWh"
    if usage.price_per_kwh is not None:
        number += f", {power.energy_cost(kwh, usage.price_per_kwh):.2f} {usage.currency}"
    return Verdict("energy", INFO, number,
                   f"{watts:g} W for {usage.hours:g} h" + (f" / {efficiency:.0%} PSU efficiency" if efficiency < 1 else ""))


def psu_efficiency(build: Build):
    """A high efficiency rating for many GPUs: what the PSU's losses cost over the run."""
    usage, eff = build.usage, build.psu.efficiency
    if eff is None or usage.hours is None or usage.price_per_kwh is None:
        return Skipped("PSU efficiency", "--psu-efficiency, --hours and --price-per-kwh")
    extra = power.efficiency_surcharge(cluster_draw_w(build), usage.hours, usage.price_per_kwh, eff)
    verdict = WARNING if eff < 0.9 and build.total_gpus >= 2 else OK
    return Verdict("PSU efficiency", verdict, f"{eff:.0%}: +{extra:.2f} {usage.currency}",
                   f"losses add {1 / eff - 1:.0%} to the energy bill" +
                   ("; many GPUs: buy a high efficiency rating (80 PLUS Gold or better)" if verdict == WARNING else ""))


def network(build: Build):
    """Cluster network: ≥ 40 Gbit/s between nodes; 1 Gbit/s Ethernet makes 2 nodes slower than one."""
    nodes, gpus = build.node_count, build.total_gpus
    if nodes == 1:
        return Verdict("network", OK, "one machine", "no network between GPUs: 4 GPUs in one box beat 3 + 1 across two")
    if build.network is None:
        return Skipped("network", "--network")
    rate = build.network.data_gbit_per_s
    coded = "" if rate == build.network.gbit_per_s else \
        f" ({build.network.name}: {build.network.gbit_per_s:g} Gbit/s on the wire, {rate:g} of data after line coding)"
    fits = " (these GPUs fit one machine, which beats any network)" if gpus <= 4 else ""
    if rate < 10:
        return Verdict("network", PROBLEM, f"{rate:g} Gbit/s",
                       f"at {rate:g} Gbit/s (1 Gbit/s Ethernet's class) a 2-node cluster is slower than one machine: "
                       "≥ 40 Gbit/s (FDR 56, EDR 100)"
                       + fits)
    if gpus <= 4:
        return Verdict("network", WARNING, f"{nodes} nodes, {gpus} GPUs",
                       "these GPUs fit one machine, which beats any network (4 GPUs in one box beat 3 + 1 across two)")
    if rate < 40:
        return Verdict("network", WARNING, f"{rate:g} Gbit/s",
                       f"data parallelism across nodes wants ≥ 40 Gbit/s of data{coded}")
    return Verdict("network", OK, f"{rate:g} Gbit/s", f"≥ 40 Gbit/s between nodes{coded}")


NODE_RULES = [gpu_memory, psu_watts_rule, power_connectors, ram_size, cpu_threads, cpu_clock, pcie_lanes,
              pcie_generation, cooling, slots, case, storage]
CLUSTER_RULES = [mixed_gpus, energy, psu_efficiency, network]
RULES = NODE_RULES + CLUSTER_RULES


def check(build: Build, rules=RULES) -> tuple[list[Verdict], list[Skipped]]:
    """Apply ``rules`` to ``build``: (verdicts, rules skipped for want of input). A machine's rules run on every
    kind of machine in the cluster, each verdict naming its machine when there are several; the cluster's once.

    >>> from gpurig.spec.build import build_from
    >>> verdicts, skipped = check(build_from({"gpus": [{"model": "2080ti", "count": 4}], "ram_gb": 8}, "x"))
    >>> [(v.rule, v.verdict) for v in verdicts if v.rule == "RAM size"]
    [('RAM size', 'warning')]
    """
    import dataclasses

    verdicts, skipped = [], []
    machines = build.machines()
    for rule in rules:
        if rule in CLUSTER_RULES:
            results = [rule(build)]
        else:
            results = [rule(m) for m in machines]
            if len(machines) > 1:
                results = [dataclasses.replace(r, node=machine_name(m, i)) for i, (r, m) in
                           enumerate(zip(results, machines))]
        for result in results:
            (verdicts if isinstance(result, Verdict) else skipped).append(result)
    return verdicts, skipped


def machine_name(build: Build, index: int) -> str:
    """The name of one kind of machine in a cluster's report.

    >>> from gpurig.spec.build import build_from
    >>> machine_name(build_from({"gpus": [{"model": "GTX Titan", "count": 3}], "cluster": {"nodes": 2}}, "x"), 0)
    'machine 1 (2 nodes): 3 × GeForce GTX Titan'
    """
    return f"machine {index + 1} ({build.nodes} node{'s' if build.nodes > 1 else ''}): {_gpu_names(build)}"
