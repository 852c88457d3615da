"""The hardware guide's rules, each a function of a :class:`~gpurig.spec.build.Build` giving a verdict.

``gpurig plan`` applies them to a parts list and ``gpurig doctor`` to this
machine. Every number comes from a formula in :mod:`gpurig.perf`; the
thresholds are the guide's (SEEDS.md, "Hardware rules"). A rule whose inputs
are missing is skipped and says what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpurig.perf import power, transfer
from gpurig.spec.build import USE_CASES, Build
from gpurig.spec.hardware import connector_counts
from gpurig.units import BINARY, tensor_bytes

OK, WARNING, PROBLEM, INFO = "ok", "warning", "problem", "info"
VERDICTS = (OK, WARNING, PROBLEM, INFO)
THREADS_PER_GPU = {"during": 4, "before": 2}     # preprocessing while training / before training
ASSUMED_CPU_TDP_W = 150                            # the guide's example CPU, when none is given
IMAGENET_BATCH = (32, 225, 225, 3)                 # the guide's example mini-batch (fp32)
RESNET152_STEP_MS = 216                            # the guide's forward + backward time for it
EIGHT_PIN_PER_16PIN = {450: 3, 600: 4}             # 8-pin plugs a 12VHPWR adapter takes, by the card's watts


@dataclass(frozen=True)
class Verdict:
    """One rule's outcome: ok, warning, problem (or info: a number to buy by, nothing to check against)."""

    rule: str
    verdict: str
    number: str
    reason: str


@dataclass(frozen=True)
class Skipped:
    rule: str
    needs: str


def _gpu_names(build: Build) -> str:
    return " + ".join(f"{g.count} × {g.gpu.name}" for g in build.gpus)


def gpu_memory(build: Build):
    """GPU memory against the use case (≥ 11 GB for state-of-the-art research …); 16-bit doubles what fits."""
    if build.usage.use_case is None:
        return Skipped("GPU memory", "--use-case")
    need = USE_CASES[build.usage.use_case]
    smallest = min((g.gpu for g in build.gpus), key=lambda g: g.memory_gb)
    fast_fp16 = bool(smallest.tensor_tflops) or (smallest.fp16_tflops or 0) >= (smallest.fp32_tflops or 1)
    factor = 2 if build.usage.fp16 and fast_fp16 else 1
    usable = smallest.memory_gb * factor
    how = f"{smallest.memory_gb:g} GB" + (" × 2 with 16-bit training" if factor == 2 else "")
    if build.usage.fp16 and not fast_fp16:
        how += f" ({smallest.name} has no fast 16-bit arithmetic, so 16-bit gains little)"
    verdict = OK if usable >= need else PROBLEM
    return Verdict("GPU memory", verdict, f"{usable:g} GB (need ≥ {need} GB)",
                   f"{build.usage.use_case} needs ≥ {need} GB; {smallest.name}: {how}")


def mixed_gpus(build: Build):
    """Different GPU models in one machine: data parallelism runs at the slowest one's pace."""
    models = {g.gpu.name for g in build.gpus}
    if len(models) == 1:
        return Verdict("GPU models", OK, _gpu_names(build), "one model: every rank computes at the same pace")
    return Verdict("GPU models", WARNING, f"{len(models)} models",
                   "data parallelism waits for the slowest GPU each step; GPUs of different chipsets "
                   "cannot copy peer-to-peer")


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
    have = f"PSU: {have6} × 6-pin, {have8} × 8-pin, {have16} × 16-pin"
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
    if build.cpu is None:
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


def gpu_lanes(build: Build) -> list[int] | None:
    """Lanes each GPU gets: the board's list, else the CPU's lanes split evenly (at most 16 each)."""
    n = build.gpu_count
    if build.board.lanes:
        return list(build.board.lanes[:n])
    if build.cpu is not None and build.cpu.pcie_lanes:
        share = build.cpu.pcie_lanes // n
        width = max((w for w in (16, 8, 4, 2, 1) if w <= share), default=0)
        return [width] * n
    return None


def pcie_lanes(build: Build):
    """PCIe lanes: hardly matter for 1–3 GPUs; with 4 GPUs want 8 lanes each (32 in all)."""
    lanes = gpu_lanes(build)
    if lanes is None:
        return Skipped("PCIe lanes", "--lanes or --cpu-lanes")
    n = build.gpu_count
    if len(lanes) < n or min(lanes) == 0:
        return Verdict("PCIe lanes", PROBLEM, "/".join(map(str, lanes)) or "0",
                       f"the board / CPU cannot give all {n} GPUs a link")
    gen = build.board.pcie_gen or min(g.pcie_gen for g in build.each_gpu())
    worst = min(lanes)
    batch_ms = 1e3 * transfer.transfer_seconds(tensor_bytes(IMAGENET_BATCH),
                                               transfer.quoted_rate_bytes_per_s(
                                                   transfer.pcie_gbytes_per_s(gen, worst), "GB/s", base=BINARY))
    number = f"{'/'.join(map(str, lanes))} (x{worst}: {batch_ms:.2f} ms per ImageNet batch)"
    share = f"{batch_ms / RESNET152_STEP_MS:.1%} of a {RESNET152_STEP_MS} ms ResNet-152 step, 0 % with pinned-memory prefetch"
    if n >= 4 and worst < 8:
        return Verdict("PCIe lanes", WARNING, number, f"with {n} GPUs give each ≥ 8 lanes ({8 * n} in all); {share}")
    return Verdict("PCIe lanes", OK, number,
                   f"PCIe {gen}; {'hardly matters for 1–3 GPUs' if n < 4 else '≥ 8 lanes each'}; {share}")


def _adjacent(build: Build) -> bool:
    """Whether the GPUs sit with no free slot between them."""
    widths = [g.slot_width or 2 for g in build.each_gpu()]
    if build.board.slot_pitch is not None:
        return build.board.slot_pitch <= max(widths)
    if build.board.gpu_slots is not None and build.gpu_count <= build.board.gpu_slots // 2:
        return False  # e.g. 2 GPUs on a 4-GPU board: a free slot between them
    return build.gpu_count >= 3


def cooling(build: Build):
    """Cooling: blower or water cooling for 3–4 adjacent GPUs; expected throttling loss."""
    coolers = {g.cooling for g in build.gpus}
    n = build.gpu_count
    if n == 1:
        return Verdict("cooling", OK, "0–10 % throttling", "one GPU: air cooling is best; it throttles at ~80 °C")
    if "water" in coolers and len(coolers) == 1:
        return Verdict("cooling", OK, "no throttling",
                       f"water cooling: about $100 per GPU + $50 (≈ ${100 * n + 50})")
    if not _adjacent(build):
        return Verdict("cooling", OK, "10–25 % throttling", "GPUs with space between them heat each other a little")
    if "open" in coolers:
        return Verdict("cooling", PROBLEM, "~30 % slower",
                       "non-blower (open-air) cards side by side recirculate hot air, throttle and die sooner: "
                       "get blower-style cards or water cooling")
    if "passive" in coolers:
        return Verdict("cooling", WARNING, "needs server airflow",
                       "passive data-center cards need a server chassis' forced airflow")
    return Verdict("cooling", OK, "10–15 % throttling", "blower-style fans push the heat out of the case")


def slots(build: Build):
    """Board slots: one x16-size slot per GPU, double-width spacing; usually 4 GPUs at most."""
    n = build.gpu_count
    width = max(g.slot_width or 2 for g in build.each_gpu())
    modules = [g.name for g in build.each_gpu() if g.form_factor in ("sxm", "oam")]
    if modules:
        return Verdict("board slots", WARNING, f"{len(modules)} modules",
                       f"{modules[0]} is an {build.each_gpu()[0].form_factor.upper()} module for a server board "
                       "(HGX/OAM), not a PCIe card")
    if build.board.gpu_slots is None:
        return Verdict("board slots", INFO, f"{n} slots, {width} apart",
                       f"{n} x16-size slots spaced for {width}-slot-wide cards" +
                       ("; more than 4 GPUs rarely fit one board" if n > 4 else ""))
    if build.board.gpu_slots < n:
        return Verdict("board slots", PROBLEM, f"{build.board.gpu_slots} < {n}", "not enough GPU slots")
    if build.board.slot_pitch is not None and build.board.slot_pitch < width:
        return Verdict("board slots", PROBLEM, f"{width}-slot cards, slots {build.board.slot_pitch} apart",
                       "each card covers the next slot")
    if n > 4:
        return Verdict("board slots", WARNING, f"{n} GPUs", "boards usually support 4 GPUs at most")
    return Verdict("board slots", OK, f"{build.board.gpu_slots} slots for {n}", f"{width}-slot cards fit")


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
    """Watts the parts draw at full load: GPU TDPs + CPU TDP, unless a measured draw is given."""
    if build.usage.draw_w is not None:
        return build.usage.draw_w
    return sum(g.tdp_w or 0 for g in build.each_gpu()) + cpu_tdp(build)


def energy(build: Build):
    """Energy for the run: kWh and money at the price per kWh, behind the PSU's efficiency."""
    usage = build.usage
    if usage.hours is None:
        return Skipped("energy", "--hours")
    watts = system_draw_w(build) * build.nodes
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
    extra = power.efficiency_surcharge(system_draw_w(build) * build.nodes, usage.hours, usage.price_per_kwh, eff)
    verdict = WARNING if eff < 0.9 and build.gpu_count >= 2 else OK
    return Verdict("PSU efficiency", verdict, f"{eff:.0%}: +{extra:.2f} {usage.currency}",
                   f"losses add {1 / eff - 1:.0%} to the energy bill" +
                   ("; many GPUs: buy a high efficiency rating (80 PLUS Gold or better)" if verdict == WARNING else ""))


def network(build: Build):
    """Cluster network: ≥ 40 Gbit/s between nodes; 1 Gbit/s Ethernet makes 2 nodes slower than one."""
    if build.nodes == 1:
        return Verdict("network", OK, "one machine", "no network between GPUs: 4 GPUs in one box beat 3 + 1 across two")
    if build.network is None:
        return Skipped("network", "--network")
    rate = build.network.data_gbit_per_s
    if build.gpu_count * build.nodes <= 4:
        return Verdict("network", WARNING, f"{build.nodes} nodes, {build.gpu_count * build.nodes} GPUs",
                       "these GPUs fit one machine, which beats any network (4 GPUs in one box beat 3 + 1 across two)")
    if rate < 10:
        return Verdict("network", PROBLEM, f"{rate:g} Gbit/s",
                       "on 1 Gbit/s Ethernet a 2-node cluster is slower than one machine: ≥ 40 Gbit/s (FDR 56, EDR 100)")
    if rate < 40:
        return Verdict("network", WARNING, f"{rate:g} Gbit/s", "data parallelism across nodes wants ≥ 40 Gbit/s")
    return Verdict("network", OK, f"{rate:g} Gbit/s", "≥ 40 Gbit/s between nodes")


RULES = [gpu_memory, mixed_gpus, psu_watts_rule, power_connectors, ram_size, cpu_threads, cpu_clock, pcie_lanes,
         cooling, slots, storage, energy, psu_efficiency, network]


def check(build: Build, rules=RULES) -> tuple[list[Verdict], list[Skipped]]:
    """Apply ``rules`` to ``build``: (verdicts, rules skipped for want of input).

    >>> from gpurig.spec.build import build_from
    >>> verdicts, skipped = check(build_from({"gpus": [{"model": "2080ti", "count": 4}], "ram_gb": 8}, "x"))
    >>> [(v.rule, v.verdict) for v in verdicts if v.rule == "RAM size"]
    [('RAM size', 'warning')]
    """
    verdicts, skipped = [], []
    for rule in rules:
        result = rule(build)
        (verdicts if isinstance(result, Verdict) else skipped).append(result)
    return verdicts, skipped
