"""Run every benchmark of the data-parallel runtime on 2 local ranks and print the tables.

    make bench                       # or: .venv/bin/python benchmarks/run_all.py [--quick]

Each benchmark is a small script launched through ``gpurig run``; rank 0 writes
JSON to benchmarks/results/, and this driver prints rich tables from it. The
numbers recorded in docs/benchmarks.md come from this command.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).parent
RESULTS = HERE / "results"
console = Console(width=None if sys.stdout.isatty() else 150)


def launch(script: str, *args, ranks: int = 2) -> dict:
    """Run ``benchmarks/<script>`` on ``ranks`` MPI ranks; return rank 0's JSON."""
    out = RESULTS / f"{Path(script).stem}{'-' + '-'.join(map(str, args)) if args else ''}.json".replace("--", "")
    cmd = [sys.executable, "-m", "gpurig", "run", "-n", str(ranks), "--", sys.executable, str(HERE / script),
           *map(str, args), "--out", str(out)]
    subprocess.run(cmd, check=True, timeout=900, env={"PYTHONPATH": str(HERE), **__import__("os").environ})
    return json.loads(out.read_text())


def dp_vs_ddp(quick: bool) -> None:
    for model in ("mlp", "cnn"):
        result = launch("dp_vs_ddp.py", "--model", model, "--rounds", 20 if quick else 100)
        rows = result["variants"]
        ddp = {"gloo": rows["torch DDP / gloo"]["samples_per_s"],
               "1 MB": rows["torch DDP / gloo, 1 MB buckets"]["samples_per_s"]}
        table = Table(title=f"Training step, {model} ({result['parameters'] / 1e6:.1f} M params), "
                            f"{result['ranks']} ranks x {result['per_rank_batch']} samples (median of interleaved steps)")
        for col in ("variant", "step ms", "samples/s", "vs DDP (same buckets)", "exposed comm ms",
                    "allreduce alone ms", "hidden"):
            table.add_column(col, justify="left" if col == "variant" else "right")
        for name, row in rows.items():
            reference = ddp["1 MB"] if "1 MB" in name else ddp["gloo"]
            hidden = f"{row['hidden_fraction']:.0%}" if "hidden_fraction" in row else ""
            table.add_row(name, f"{row['step_ms']:.1f}", f"{row['samples_per_s']:.0f}",
                          f"{row['samples_per_s'] / reference:.2f}x",
                          f"{row['exposed_ms']:.1f}" if "exposed_ms" in row else "",
                          f"{row['allreduce_alone_ms']:.1f}" if "allreduce_alone_ms" in row else "", hidden)
        console.print(table)


def busbw(quick: bool) -> None:
    result = launch("allreduce_busbw.py", "--max-mb", 16 if quick else 256)
    table = Table(title=f"Allreduce (sum, fp32), {result['ranks']} ranks: busbw GB/s = bytes/time x 2(n-1)/n")
    for col in ("engine", "size", "raw us", "gpurig us", "raw busbw", "gpurig busbw", "gpurig/raw"):
        table.add_column(col, justify="right")
    for row in result["rows"]:
        size = row["bytes"]
        label = f"{size // 2**20} MB" if size >= 2**20 else f"{size // 1024} KB"
        table.add_row(row["engine"], label, f"{row['raw_us']:.0f}", f"{row['gpurig_us']:.0f}",
                      f"{row['raw_busbw_gbps']:.2f}", f"{row['gpurig_busbw_gbps']:.2f}", f"{row['ratio']:.2f}")
    console.print(table)


def memory(quick: bool) -> None:
    results = {v: launch("memory.py", "--variant", v) for v in ("single", "gpurig-mpi", "gpurig-gloo", "ddp-gloo")}
    grad = results["single"]["gradient_bytes"]
    base = max(results["single"]["growth_bytes_per_rank"])
    table = Table(title=f"Peak memory growth per rank during training, 784-4096-4096-10 "
                        f"(one copy of the gradients = {grad / 2**20:.0f} MB)")
    for col in ("variant", "growth MB (max over ranks)", "extra over no DP, MB", "extra in gradient copies"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        growth = max(r["growth_bytes_per_rank"])
        table.add_row(name, f"{growth / 2**20:.0f}", f"{(growth - base) / 2**20:.0f}", f"{(growth - base) / grad:.2f}")
    console.print(table)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds and sizes (about a minute)")
    p.add_argument("--only", choices=["dp", "busbw", "memory"], help="run one benchmark")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    for name, fn in (("dp", dp_vs_ddp), ("busbw", busbw), ("memory", memory)):
        if args.only in (None, name):
            fn(args.quick)


if __name__ == "__main__":
    main()
