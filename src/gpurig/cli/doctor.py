"""``gpurig doctor`` on the command line: probe, print verdicts (rich or JSON), optionally write the spec."""

from __future__ import annotations

import argparse
import json

from gpurig.cli.common import HelpFormatter
from gpurig.spec.build import USE_CASES

EPILOG = """\
examples:
  gpurig doctor                              # what this machine is, and what is wrong with it for deep learning
  gpurig doctor --write-spec machine.toml    # ... and save it as a cluster spec
  gpurig plan --spec machine.toml --use-case research    # then hold it against a use case
  gpurig doctor --json | jq .facts.nvml      # machine-readable

Probes: CPU model, cores and clock; RAM; disks (SSD or HDD from
/sys/block/*/queue/rotational); network interfaces and link speeds; NVIDIA GPUs
through NVML (memory, PCIe generation and width current vs maximum, temperature,
clocks, throttle reasons, peer-to-peer, NVLink, and how the GPUs are wired:
sockets and PCIe switches, as nvidia-smi topo -m shows them); whether the fans
can be set (Coolbits in the X configuration); MPI and whether it is
CUDA-aware (asked in a child process, so MPI is not started here). Without a GPU
it says so and checks the rest; the exit code is 0 whatever it finds.
"""


def add_parser(subparsers) -> None:
    """Register ``gpurig doctor``."""
    p = subparsers.add_parser(
        "doctor", help="probe this machine (CPU, RAM, disks, GPUs via NVML, MPI, network) and check it",
        description="Probe this machine and hold it against the hardware guide's rules.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("--write-spec", metavar="FILE", help="write the facts as a cluster spec (TOML)")
    p.add_argument("--use-case", choices=list(USE_CASES), metavar="USE",
                   help=f"also check the GPUs' memory for this use: {', '.join(USE_CASES)}")
    p.add_argument("--preprocessing", choices=["during", "before"], default="during",
                   help="preprocessing during training (default: 4 threads per GPU) or before (2)")
    p.add_argument("--json", action="store_true", help="print facts and verdicts as JSON")
    p.set_defaults(handler=run)


def run(args) -> int:
    """Run ``gpurig doctor``; return 0."""
    from gpurig.hardware.doctor import doctor, probe, write_spec

    if args.write_spec is not None:
        _check_writable(args.write_spec)
    facts = probe()
    report = doctor(facts, use_case=args.use_case, preprocessing=args.preprocessing)
    if args.write_spec:
        write_spec(facts, args.write_spec)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return 0
    show(report, args.write_spec)
    return 0


def _check_writable(path: str) -> None:
    """Refuse, before probing, a --write-spec path that cannot be written.

    >>> _check_writable("/nonexistent/dir/spec.toml")
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --write-spec '/nonexistent/dir/spec.toml': no directory /nonexistent/dir to write it in
    """
    import os

    from gpurig.errors import UsageError

    directory = os.path.dirname(path) or "."
    if not path or os.path.isdir(path):
        raise UsageError(f"--write-spec {path!r}: give a file name")
    if not os.path.isdir(directory):
        raise UsageError(f"--write-spec {path!r}: no directory {directory} to write it in")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"--write-spec {path!r}: {directory} is not writable")


def show(report: dict, spec_path: str | None) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpurig.cli.plan import STYLE

    facts = report["facts"]
    console = Console()
    cpu = facts["cpu"]
    console.print(f"[bold]gpurig doctor[/]: {facts['hostname']}: {cpu['model']}, {cpu['cores']} cores / "
                  f"{cpu['threads']} threads, {facts['ram_gb']:g} GB RAM, "
                  f"{len(facts['nvml']['gpus'])} GPU(s)")
    if facts["nvml"]["gpus"]:
        gpus = Table(title="GPUs (NVML)", title_justify="left")
        for header in ("#", "name", "memory GB", "PCIe now/max", "°C", "SM MHz", "W / limit", "throttle", "NVLinks"):
            gpus.add_column(header)
        for i, d in enumerate(facts["nvml"]["gpus"]):
            gpus.add_row(str(i), str(d["name"]), str(d["memory_gb"]),
                         f"gen{d['pcie_gen']} x{d['pcie_width']} / gen{d['pcie_gen_max']} x{d['pcie_width_max']}",
                         str(d["temperature_c"]), f"{d['sm_clock_mhz']}/{d['sm_clock_max_mhz']}",
                         f"{d['power_w']} / {d['power_limit_w']}", ", ".join(d["throttle_reasons"] or []) or "-",
                         str(len(d["nvlinks"])))
        console.print(gpus)
    table = Table(title="checks", title_justify="left")
    for header in ("check", "verdict", "number", "why"):
        table.add_column(header, overflow="fold")
    for v in report["verdicts"]:
        table.add_row(v["rule"], f"[{STYLE[v['verdict']]}]{v['verdict']}[/]", v["number"], v["reason"])
    console.print(table)
    if report["skipped"]:
        console.print("not checked: " + "; ".join(f"{s['rule']} (needs {s['needs']})" for s in report["skipped"]))
    if spec_path:
        console.print(f"cluster spec written to {spec_path} (gpurig plan --spec {spec_path})")
