"""The whole build around the GPUs, part by part, by the hardware guide's rules as ``gpurig plan`` applies them.

For each kind of machine in an option: the cheapest CPU and board of a platform whose threads, PCIe lanes and
slots pass plan's rules (:func:`gpurig.hardware.rules.cpu_threads`, ``pcie_lanes``, ``slots``), the cheapest PSU
that passes the PSU rule, the cheapest RAM that passes the RAM rule, and the platform's case, SSD and cooler.
Where no part passes, the most capable one is taken and plan's verdict says why. Then ``plan`` checks the
whole build, and its energy over the hours is the rules' (:func:`gpurig.hardware.rules.cluster_draw_w`,
:mod:`gpurig.perf.power`).

>>> from gpurig.hardware.plan import inputs
>>> from gpurig.choose.prices import price_book
>>> built = build_with_parts(inputs(description="2 x RTX 4090"), price_book((), None))
>>> [part.kind for part in built.parts[0]]
['cpu', 'board', 'psu', 'ram', 'base']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpurig.choose.prices import Price, PriceBook
from gpurig.hardware import rules
from gpurig.hardware.plan import plan
from gpurig.perf import power
from gpurig.spec.build import PSU, Build
from gpurig.spec.cluster import CPU
from gpurig.spec.prices import Part, parts

PASSING = (rules.OK, rules.INFO)


@dataclass(frozen=True)
class PricedBuild:
    """A build with every machine's parts and their prices (``parts[i]``: machine ``i`` of ``build.machines()``)."""

    build: Build
    parts: tuple[tuple[Part, ...], ...]
    prices: tuple[tuple[Price, ...], ...]

    def parts_usd(self) -> float:
        """What the parts besides the GPUs cost, every machine times its count.

        >>> from gpurig.hardware.plan import inputs
        >>> from gpurig.choose.prices import price_book
        >>> build_with_parts(inputs(description="1 x RTX 4090"), price_book((), None)).parts_usd() > 500
        True
        """
        return sum(m.nodes * sum(p.usd for p in prices) for m, prices in zip(self.build.machines(), self.prices))


def _passes(*verdicts) -> bool:
    return all(isinstance(v, rules.Skipped) or v.verdict in PASSING for v in verdicts)


def _with_platform(machine: Build, cpu: Part, board: Part) -> Build:
    chosen_board = dataclasses.replace(machine.board, gpu_slots=board.gpu_slots, slot_pitch=board.slot_pitch)
    return dataclasses.replace(machine, cpu=CPU(threads=cpu.threads, cores=cpu.threads // 2, tdp_w=cpu.tdp_w,
                                                pcie_lanes=cpu.pcie_lanes, model=cpu.name), board=chosen_board)


def machine_parts(machine: Build, book: PriceBook) -> tuple[Build, tuple[Part, ...]]:
    """One kind of machine with its cheapest parts that pass plan's rules (the most capable where none does).

    >>> from gpurig.hardware.plan import inputs
    >>> from gpurig.choose.prices import price_book
    >>> _, chosen = machine_parts(inputs(description="4 x RTX 6000 Ada"), price_book((), None))
    >>> [p.name for p in chosen if p.kind in ("cpu", "psu")]
    ['AMD Ryzen Threadripper 7960X', '2 x 1600 W 80 PLUS Platinum']
    """
    catalog = parts()

    def cost(*chosen: Part) -> float:
        return sum(book.part(p).usd for p in chosen)

    bases = {p.platform: p for p in catalog if p.kind == "base"}
    pairs = sorted(((c, b) for c in catalog if c.kind == "cpu" for b in catalog
                    if b.kind == "board" and b.platform == c.platform),
                   key=lambda pair: cost(*pair, bases[pair[0].platform]))
    # a board with fewer slots than GPUs is no build at all: tried only when no board has enough
    pairs = [pair for pair in pairs if pair[1].gpu_slots >= machine.gpu_count] or pairs
    scored = []
    for cpu, board in pairs:
        candidate = _with_platform(machine, cpu, board)
        checks = (rules.cpu_threads(candidate), rules.pcie_lanes(candidate), rules.slots(candidate))
        failing = sum(not _passes(v) for v in checks)
        scored.append((failing, cpu, board))
        if failing == 0:
            break
    # the fewest failing rules; among equals, where none passes, the most capable (slots, then lanes: a 1-slot
    # board under 8 GPUs fails the same two rules as a 4-slot one), then the cheapest (``pairs`` is in price order)
    _, cpu, board = min(scored, key=lambda s: (s[0], -(s[2].gpu_slots or 0), -(s[1].pcie_lanes or 0)))
    machine = _with_platform(machine, cpu, board)

    psus = sorted((p for p in catalog if p.kind == "psu"), key=lambda p: book.part(p).usd)
    psu = next((p for p in psus if _passes(rules.psu_watts_rule(dataclasses.replace(
        machine, psu=PSU(watts=p.watts))))), max(psus, key=lambda p: p.watts))
    machine = dataclasses.replace(machine, psu=dataclasses.replace(machine.psu, watts=psu.watts,
                                                                   efficiency=psu.efficiency))
    # memory the platform takes (TRX50: registered DIMMs only; AM5: unbuffered)
    rams = sorted((p for p in catalog if p.kind == "ram" and p.platform in (None, cpu.platform)),
                  key=lambda p: book.part(p).usd)
    ram = next((p for p in rams if _passes(rules.ram_size(dataclasses.replace(machine, ram_gb=p.ram_gb)))),
               max(rams, key=lambda p: p.ram_gb))
    machine = dataclasses.replace(machine, ram_gb=ram.ram_gb)
    return machine, (cpu, board, psu, ram, bases[cpu.platform])


def build_with_parts(build: Build, book: PriceBook, hours: float | None = None,
                     price_per_kwh: float | None = None) -> PricedBuild:
    """``build`` (from plan's inputs) with every machine's parts chosen, and the run's hours and electricity
    price for plan's energy rules."""
    chosen = [machine_parts(m, book) for m in build.machines()]
    first, *others = [machine for machine, _ in chosen]
    usage = dataclasses.replace(build.usage, hours=hours, price_per_kwh=price_per_kwh, currency="$")
    whole = dataclasses.replace(first, usage=usage, other_nodes=tuple(others))
    return PricedBuild(whole, tuple(p for _, p in chosen),
                       tuple(tuple(book.part(part) for part in p) for _, p in chosen))


def energy(build: Build, hours: float, price_per_kwh: float) -> dict:
    """The run's energy as plan's energy rule counts it: every machine's draw, behind the first PSU's efficiency.

    >>> from gpurig.hardware.plan import inputs
    >>> e = energy(inputs(description="1 x RTX 4090"), 10, 0.2)
    >>> e["draw_w"], e["kwh"], round(e["usd"], 2)
    (600.0, 6.0, 1.2)
    """
    watts = rules.cluster_draw_w(build)
    kwh = power.wall_energy_kwh(watts, hours, build.psu.efficiency or 1.0)
    return {"draw_w": watts, "kwh": kwh, "usd": power.energy_cost(kwh, price_per_kwh)}


def plan_report(priced: PricedBuild) -> dict:
    """``gpurig plan``'s report on the build: the overall verdict, and the rules that warn or fail.

    >>> from gpurig.hardware.plan import inputs
    >>> from gpurig.choose.prices import price_book
    >>> plan_report(build_with_parts(inputs(description="1 x RTX 4070"), price_book((), None)))["overall"]
    'ok'
    """
    report = plan(priced.build)
    return {"overall": report["overall"], "psu_w": report["psu"]["gpurig_psu_w"],
            "concerns": [{"rule": v["rule"], "verdict": v["verdict"], "number": v["number"], "reason": v["reason"]}
                         for v in report["verdicts"] if v["verdict"] in (rules.WARNING, rules.PROBLEM)],
            "energy": next((v["number"] for v in report["verdicts"] if v["rule"] == "energy"), None)}


__all__ = ["PricedBuild", "build_with_parts", "machine_parts", "energy", "plan_report"]
