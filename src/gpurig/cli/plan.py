"""``gpurig plan`` on the command line: flags or a build file in, a verdict table (or JSON) out."""

from __future__ import annotations

import argparse
import json
import re

from gpurig.cli.common import HelpFormatter, WIDE_COLUMNS
from gpurig.spec.build import USE_CASES

EPILOG = """\
examples:
  gpurig plan --gpu "RTX 2080 Ti" --count 4 --cpu-threads 16 --ram-gb 64 --psu-watts 1600
  gpurig plan --gpu 4x2080ti --psu-watts 1300 --psu-8pin 8 --slots 4 --slot-pitch 2 --cooler blower
  gpurig plan --build examples/build-4x2080ti.toml             # a parts list (docs/hardware.md)
  gpurig plan --build my.toml --psu-watts 1600                 # a flag overrides the file
  gpurig plan --spec machine.toml --use-case research          # what `gpurig doctor --write-spec` found
  gpurig plan --describe "2 nodes x 4 V100, 10GbE" --hours 336
  gpurig plan --spec examples/cluster-3+1-titan.toml --hours 336   # every [[nodes]] table, machine by machine
  gpurig plan --gpu 4x"GTX Titan X" --cpu-lanes 40 --pcie-gen 2.0   # lanes split 16/8/8/8; PCIe 2.0 priced
  gpurig plan --gpu 2080ti -c 4 --hours 336 --price-per-kwh 0.20 --psu-efficiency 0.8 --json
  gpurig plan --list-gpus                                      # the catalog

Rules (the hardware guide): PSU = (GPU TDPs + CPU TDP) x 1.1 rounded up to 50 W;
enough 6/8-pin connectors; RAM >= the largest GPU's memory; >= 4 CPU threads
per GPU when preprocessing during training (2 when before); > 2 GHz; 8 PCIe
lanes per GPU with 4 GPUs, split from the CPU's lanes as boards do (40: 16/8/8/8,
16/16/8; a network card takes lanes too; at most 4 devices per CPU); PCIe 3.0
for several GPUs (2.0's cost predicted); blower or water cooling for 3-4
adjacent cards; one slot per GPU, double-width spacing; a case for full-length
cards and the radiators; GPU memory for the use case; energy for the run. A
cluster spec's every kind of machine is checked. A rule whose inputs are missing is listed as not checked. Exit code 0
whatever the verdicts (2 for bad input).
"""


def add_parser(subparsers) -> None:
    """Register ``gpurig plan`` and its flags."""
    p = subparsers.add_parser(
        "plan", help="check a parts list against the hardware guide's rules (PSU, RAM, CPU, lanes, cooling, energy)",
        description="Check a multi-GPU build against every rule of the hardware guide: a verdict (ok / warning / "
                    "problem / info) per rule, with the number and the reason.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    src = p.add_argument_group("where the parts come from (at most one; flags override it)")
    src.add_argument("--build", metavar="FILE", help="a TOML parts list (see examples/)")
    src.add_argument("--spec", metavar="FILE", help="a cluster spec, e.g. from gpurig doctor --write-spec")
    src.add_argument("--describe", metavar="TEXT", help='a one-line cluster, e.g. "2 nodes x 4 RTX 2080 Ti, 10GbE"')
    g = p.add_argument_group("GPUs")
    g.add_argument("--gpu", action="append", metavar="[Nx]NAME",
                   help='a catalog GPU ("RTX 2080 Ti", "2080ti", "4x V100"); repeat for mixed GPUs')
    g.add_argument("-c", "--count", type=int, metavar="N", help="GPUs of each --gpu without an Nx prefix (default 1)")
    g.add_argument("--cooler", choices=["blower", "open", "passive", "water"], help="the GPUs' cooling (default: "
                   "the reference card's)")
    c = p.add_argument_group("CPU, RAM, PSU, board, storage")
    c.add_argument("--cpu-cores", type=int, metavar="N")
    c.add_argument("--cpu-threads", type=int, metavar="N")
    c.add_argument("--cpu-ghz", type=float, metavar="GHZ")
    c.add_argument("--cpu-tdp", type=float, metavar="W", help="CPU TDP (default 150 W, the guide's example)")
    c.add_argument("--cpu-lanes", type=int, metavar="N", help="PCIe lanes the CPU provides for GPUs")
    c.add_argument("--ram-gb", type=float, metavar="GB")
    c.add_argument("--psu-watts", type=float, metavar="W")
    c.add_argument("--psu-efficiency", type=float, metavar="F", help="e.g. 0.8 (80 %%), 0.92 (80 PLUS Gold)")
    c.add_argument("--psu-6pin", type=int, metavar="N", help="PCIe 6-pin connectors on the PSU")
    c.add_argument("--psu-8pin", type=int, metavar="N", help="PCIe 8-pin (6+2) connectors on the PSU")
    c.add_argument("--psu-16pin", type=int, metavar="N", help="12VHPWR / 12V-2x6 connectors on the PSU")
    c.add_argument("--psu-eps", type=int, metavar="N",
                   help="EPS 8-pin (CPU) connectors on the PSU beyond the CPU's own: workstation and data-centre "
                        "PCIe cards (RTX A6000, A100 PCIe) take these")
    c.add_argument("--slots", type=int, metavar="N", help="x16-size GPU slots on the board")
    c.add_argument("--slot-pitch", type=int, metavar="N", help="slots from one GPU slot to the next (2 = double spacing)")
    c.add_argument("--lanes", metavar="L,L,..", help="lanes each GPU gets, e.g. 16,8,8,8")
    c.add_argument("--pcie-gen", metavar="GEN", help="the board's PCIe generation, e.g. 3.0")
    c.add_argument("--sockets", type=int, metavar="N", help="CPU sockets (--cpu-lanes each; GPUs spread over them)")
    c.add_argument("--pcie-switches", type=int, metavar="N", help="PCIe switches (PLX) the GPUs sit behind")
    c.add_argument("--case-gpu-mm", type=float, metavar="MM", help="the longest card the case takes")
    c.add_argument("--case-radiators", type=int, metavar="N", help="radiator mounts in the case (water cooling)")
    c.add_argument("--ssd-gb", type=float, metavar="GB")
    c.add_argument("--hdd-gb", type=float, metavar="GB")
    u = p.add_argument_group("use")
    u.add_argument("--preprocessing", choices=["during", "before"], help="preprocess during training (default) or before")
    u.add_argument("--use-case", choices=list(USE_CASES), metavar="USE",
                   help=f"what the machine is for, which sets the GPU memory it needs: {', '.join(USE_CASES)}")
    u.add_argument("--fp16", action="store_true", default=None, help="16-bit training (doubles what fits)")
    u.add_argument("--hours", type=float, metavar="H", help="training hours, for energy (two weeks = 336)")
    u.add_argument("--price-per-kwh", type=float, metavar="P", help="electricity price (the guide: 0.20 €)")
    u.add_argument("--currency", metavar="SYMBOL")
    u.add_argument("--draw-watts", type=float, metavar="W", help="the system's draw, if known (default: TDPs)")
    u.add_argument("--nodes", type=int, metavar="N", help="machines like this one")
    u.add_argument("--network", metavar="NET", help='between nodes: "10GbE", "FDR", "40 Gbit/s InfiniBand"')
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--list-gpus", action="store_true", help="list the catalog's GPUs and exit")
    p.set_defaults(handler=run)


def _gpu_groups(specs: list[str], count: int | None, cooler: str | None) -> list[dict]:
    from gpurig.spec.describe import one_gpu_name

    groups = []
    for spec in specs:
        match = re.fullmatch(r"\s*(\d+)\s*[x×*]\s*(.+)", spec)
        if match and one_gpu_name(spec, int(match[1]), match[2]):
            match = None   # "7900 XTX" is one GPU; "7900 xt" is an unknown one, not 7900 GPUs of "t"
        group = {"model": match[2], "count": int(match[1])} if match else \
            {"model": spec, "count": 1 if count is None else count}  # -c 0 is refused by the spec's check
        if cooler:
            group["cooler"] = cooler
        groups.append(group)
    return groups


def flags_to_data(args) -> dict:
    """The build-file structure of the flags that were given (None = not given)."""
    def table(**fields):
        return {k: v for k, v in fields.items() if v is not None}

    data = {}
    if args.gpu:
        data["gpus"] = _gpu_groups(args.gpu, args.count, args.cooler)
    if args.ram_gb is not None:
        data["ram_gb"] = args.ram_gb
    parts = {
        "cpu": table(cores=args.cpu_cores,
                     threads=args.cpu_threads, ghz=args.cpu_ghz, tdp_w=args.cpu_tdp, pcie_lanes=args.cpu_lanes),
        "psu": table(watts=args.psu_watts, efficiency=args.psu_efficiency, pcie_6pin=args.psu_6pin,
                     pcie_8pin=args.psu_8pin, pcie_16pin=args.psu_16pin, eps_8pin=args.psu_eps),
        "board": table(gpu_slots=args.slots, slot_pitch=args.slot_pitch, pcie_gen=args.pcie_gen,
                       sockets=args.sockets, pcie_switches=args.pcie_switches,
                       lanes=_lane_list(args.lanes) if args.lanes else None),
        "case": table(gpu_length_mm=args.case_gpu_mm, radiators=args.case_radiators),
        "storage": table(ssd_gb=args.ssd_gb, hdd_gb=args.hdd_gb),
        "usage": table(preprocessing=args.preprocessing, use_case=args.use_case, fp16=args.fp16, hours=args.hours,
                       price_per_kwh=args.price_per_kwh, currency=args.currency, draw_w=args.draw_watts),
        "cluster": table(nodes=args.nodes, network=args.network),
    }
    data.update({k: v for k, v in parts.items() if v})
    return data


def _lane_list(text: str) -> list[int]:
    from gpurig.errors import UsageError

    try:
        return [int(x) for x in re.split(r"[,/ ]+", text.strip()) if x]
    except ValueError:
        raise UsageError(f"--lanes: expected numbers like 16,8,8,8, got {text!r}") from None


def run(args) -> int:
    """Run ``gpurig plan`` with parsed ``args``; return the exit code."""
    from gpurig.hardware.plan import inputs, plan

    if args.list_gpus:
        return _list_gpus(args.json)
    report = plan(inputs(args.build, args.spec, args.describe, flags_to_data(args)))
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        show(report)
    return 0


STYLE = {"ok": "green", "warning": "yellow", "problem": "bold red", "info": "cyan"}


def show(report: dict) -> None:
    """The report as a rich table, then the rules not checked and the PSU rule's versions."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    machines = report["machines"]
    def name(m):
        gpus = " + ".join(f"{g['count']} × {g['model']}" for g in m["gpus"])
        return f"{m['nodes']} nodes × {gpus}" if m["nodes"] > 1 else gpus
    several = len(machines) > 1
    title = " + ".join(f"[{name(m)}]" if several else name(m) for m in machines)
    table = Table(title=f"gpurig plan: {title}", title_justify="left")
    headers = (("machine",) if several else ()) + ("rule", "verdict", "number", "why")
    for header in headers:
        table.add_column(header, overflow="fold")
    for v in report["verdicts"]:
        style = STYLE[v["verdict"]]
        where = (f"{v['node'].split(':')[0]}" if v["node"] else "cluster",) if several else ()
        table.add_row(*where, v["rule"], f"[{style}]{v['verdict']}[/]", v["number"], v["reason"])
    console.print(table)
    if several:
        console.print("; ".join(m["name"] for m in machines))
    if report["skipped"]:
        needs = dict.fromkeys(f"{s['rule']} (give {s['needs']})" for s in report["skipped"])
        console.print("not checked: " + "; ".join(needs))
    for m in machines:
        psu = m["psu"]
        console.print(f"PSU rule{' for ' + m['name'].split(':')[0] if several else ''}: gpurig uses "
                      f"(GPU TDPs + CPU TDP) × 1.1 = {psu['gpurig_w']:g} W → {psu['gpurig_psu_w']} W; "
                      f"the guide's worked example adds 10 % of the GPU watts ({psu['guide_example_w']:g} W), then "
                      f"another 10 % = {psu['guide_example_margin_w']:g} W → {psu['guide_example_psu_w']} W")
    console.print(f"overall: [{STYLE[report['overall']]}]{report['overall']}[/]")


def _list_gpus(as_json: bool) -> int:
    import dataclasses

    from rich.console import Console
    from rich.table import Table

    from gpurig.spec import gpus

    rows = gpus()
    if as_json:
        print(json.dumps([dataclasses.asdict(g) for g in rows], indent=2))
        return 0
    def tflops(value):
        return f"{value:g}" if value else "-"

    # (header, value, shown in an 80-column terminal): there the key numbers stay whole, the rest waits for width
    columns = [("name", lambda g: g.name, True), ("year", lambda g: str(g.year), True),
               ("GB", lambda g: f"{g.memory_gb:g}", True), ("GB/s", lambda g: f"{g.memory_bandwidth_gbs:g}", True),
               ("FP32 TF", lambda g: tflops(g.fp32_tflops), True), ("FP16 TC", lambda g: tflops(g.tensor_tflops), True),
               ("TF32 TC", lambda g: tflops(g.tf32_tflops), False), ("FP8 TC", lambda g: tflops(g.fp8_tflops), False),
               ("TDP W", lambda g: f"{g.tdp_w:g}", True), ("PCIe", lambda g: f"{g.pcie_gen} x{g.pcie_lanes}", False),
               ("cooler", lambda g: g.cooler or "-", False)]
    console = Console()
    shown = [c for c in columns if c[2] or console.width >= WIDE_COLUMNS]
    table = Table(title="gpurig catalog: GPUs (TC: dense tensor-core TFLOPS; sources in spec/data/gpus.csv)")
    for header, _, _ in shown:
        table.add_column(header, justify="left" if header == "name" else "right", no_wrap=True)
    for g in rows:
        table.add_row(*(value(g) for _, value, _ in shown))
    console.print(table)
    return 0
