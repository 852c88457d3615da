"""Run every benchmark of the data-parallel runtime on 2 local ranks and print the tables.

    make bench                                       # = .venv/bin/python benchmarks/run_all.py
    .venv/bin/python benchmarks/run_all.py --quick   # fewer rounds and sizes, about half the time
    .venv/bin/python benchmarks/run_all.py --only busbw

Each benchmark is a small script launched with ``gpurig run -n 2`` (MPI engine;
the scripts bring up Gloo beside it); rank 0 writes JSON to benchmarks/results/,
and this driver turns it into tables: printed with rich, and written as Markdown
to benchmarks/results/tables.md (what docs/benchmarks.md quotes), together with
results/machine.json (cores, versions, load average before and after).

| benchmark | script | question |
|---|---|---|
| dp | dp_vs_ddp.py | gpurig.DataParallel's training throughput vs DDP's, same engine (Gloo) |
| overlap | overlap.py | how much of the allreduce time backward hides |
| busbw | allreduce_busbw.py | comm.allreduce vs the raw mpi4py / torch.distributed call |
| handoff | handoff.py | a collective handed to a Python thread vs begun on the caller's thread |
| memory | memory.py | peak memory per rank vs DDP and vs no data parallelism |
| checks | check_overhead.py | what the collective check and the NaN/Inf guard cost, on and off |

The benchmarks that need root (emulated nodes), a GPU or a long time run on their own,
each with its command in its docstring and its numbers in docs/:

| script | question | docs |
|---|---|---|
| compression.py (+ compression_emulated.py, codec_throughput.py) | each codec's step behind a 1 / 10 Gbit/s link; encode + decode vs memcpy | benchmarks.md |
| model_parallel.py (+ model_parallel_emulated.py) | data vs model vs hybrid parallelism behind a slow link | benchmarks.md |
| host_allocator.py | CPU steps with glibc's allocator as it comes vs as gpurig run sets it | benchmarks.md |
| chaos.py | random ranks killed or stopped: every run ends, named, resumable | reliability.md |
| predict_validation.py (+ predict_validation_ranks.py, calibration.py) | predict vs measured steps on this machine | predict.md |
| published_cases.py | predict vs published scaling results | predict.md |
| published_validation.py (data/) | predict from catalog GPUs vs 481 published throughputs, cross-validated | predict.md |
| gpu_validation.py (on_gpu.sh) | predict vs measured steps on a GPU | predict.md |

common.py holds what the 2-rank scripts share (both engines in one job, interleaved timing, results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RANKS = 2
LAUNCH_TIMEOUT_S = 600
console = Console(width=None if sys.stdout.isatty() else 160)


@dataclass
class Report:
    """One table: printed with rich and written as Markdown."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""

    def rich(self) -> Table:
        table = Table(title=escape(self.title), caption=escape(self.note) or None, caption_justify="left")
        for i, col in enumerate(self.columns):
            table.add_column(escape(col), justify="left" if i == 0 else "right")
        for row in self.rows:
            table.add_row(*map(escape, row))
        return table

    def markdown(self) -> str:
        """The table as GitHub Markdown.

        >>> print(Report("T", ["a", "b"], [["x", "1"]]).markdown())
        **T**
        <BLANKLINE>
        | a | b |
        |---|---:|
        | x | 1 |
        <BLANKLINE>
        """
        lines = [f"**{self.title}**", "", "| " + " | ".join(self.columns) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(self.columns) - 1)) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines) + "\n"


def launch(script: str, name: str, *args) -> dict:
    """Run ``benchmarks/<script> *args`` on 2 ranks with ``gpurig run``; return rank 0's JSON.

    The JSON lands in ``benchmarks/results/<name>.json``.
    """
    out = RESULTS / f"{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "gpurig", "run", "-n", str(RANKS), "--",
           sys.executable, str(HERE / script), *map(str, args), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    console.print(f"[dim]$ gpurig run -n {RANKS} -- python benchmarks/{script} {' '.join(map(str, args))}[/dim]")
    subprocess.run(cmd, check=True, timeout=LAUNCH_TIMEOUT_S, env=env)
    return json.loads(out.read_text())


def size_label(nbytes: float) -> str:
    """A message size as the tables show it.

    >>> size_label(1024), size_label(4 * 2**20)
    ('1 KB', '4 MB')
    """
    return f"{nbytes / 2**20:g} MB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KB"


def dp_vs_ddp(quick: bool) -> list[Report]:
    reports = []
    for model in ("mlp", "cnn"):
        r = launch("dp_vs_ddp.py", f"dp_vs_ddp-{model}", "--model", model, "--rounds", 6 if quick else 20)
        report = Report(
            f"Training step, {model} ({r['parameters'] / 1e6:.1f} M params), {r['ranks']} ranks x "
            f"{r['per_rank_batch']} samples, {r['rounds']} rounds of {r['block']}-step blocks",
            ["variant", "step ms", "samples/s", "spread", "vs DDP", "compared with"],
            note="step ms: median over blocks (slowest rank); spread: interquartile range / median; "
                 "vs DDP: DDP's step time / this one's, median over rounds (>1 = faster than DDP)")
        for name, row in r["variants"].items():
            is_ddp = name == row["compared_with"]
            report.rows.append([name, f"{row['step_ms']:.1f}", f"{row['samples_per_s']:.0f}",
                                f"{row['spread']:.0%}", "" if is_ddp else f"{row['vs_ddp']:.2f}x",
                                "" if is_ddp else row["compared_with"]])
        reports.append(report)
    return reports


def overlap(quick: bool) -> list[Report]:
    report = Report("Communication hidden under backward (gpurig.DataParallel)",
                    ["model", "engine, buckets", "bucket sizes MB", "step ms (no DP)", "allreduce alone ms",
                     "exposed ms", "hidden"],
                    note="step: median over blocks, in brackets the same model trained without data parallelism; "
                         "alone: the same buckets allreduced with no compute; exposed: the time backward's end "
                         "waited for them (least over the ranks, so not waiting for the other rank); hidden = 1 - exposed/alone")
    for model in ("mlp", "cnn"):
        r = launch("overlap.py", f"overlap-{model}", "--model", model, "--rounds", 6 if quick else 20)
        for name, row in r["variants"].items():
            buckets = ", ".join(f"{mb:.2g}" for mb in row["buckets_mb"])
            report.rows.append([model, name, buckets if len(buckets) < 40 else f"{len(row['buckets_mb'])} buckets",
                                f"{row['step_ms']:.1f} ({r['step_ms_without_dp']:.1f})", f"{row['alone_ms']:.2f}", f"{row['exposed_ms']:.2f}",
                                f"{row['hidden']:.0%}"])
    return [report]


def busbw(quick: bool) -> list[Report]:
    r = launch("allreduce_busbw.py", "allreduce_busbw", "--max-mb", 16 if quick else 256)
    report = Report(f"Allreduce (sum, fp32), {r['ranks']} ranks: busbw = bytes / time x 2(n-1)/n",
                    ["engine", "size", "iters", "raw us", "gpurig us", "spread", "raw busbw GB/s",
                     "gpurig busbw GB/s", "gpurig/raw", "unchecked/raw"],
                    note="raw: mpi4py Allreduce(MPI.IN_PLACE, [numpy view, MPI.FLOAT]) / dist.all_reduce; "
                         "loops of 16 back-to-back calls taking turns (nccl-tests' way), per call, slower rank, "
                         "median; gpurig/raw: median of the loops' ratios; unchecked: comm.allreduce without the "
                         "check that ranks call the same collective; spread: interquartile range / median "
                         "of the raw loops")
    for row in r["rows"]:
        report.rows.append([row["engine"], size_label(row["bytes"]), str(row["iterations"]),
                            f"{row['raw_us']:.1f}", f"{row['gpurig_us']:.1f}", f"{row['raw_spread']:.0%}",
                            f"{row['raw_busbw_gbps']:.3f}",
                            f"{row['gpurig_busbw_gbps']:.3f}", f"{row['ratio']:.2f}", f"{row['unchecked_ratio']:.2f}"])
    return [report]


MEMORY_VARIANTS = {
    "none": "no data parallelism (baseline)",
    "gpurig-mpi": "gpurig DataParallel / mpi",
    "gpurig-gloo": "gpurig DataParallel / gloo",
    "ddp-gloo": "torch DDP / gloo",
    "flat-mpi": "by hand: 1 flat buffer + MPI_Allreduce",
}


def memory(quick: bool) -> list[Report]:
    results = {v: launch("memory.py", f"memory-{v}", "--variant", v) for v in MEMORY_VARIANTS}
    grad = results["none"]["gradient_bytes"]
    base = max(results["none"]["growth_bytes_per_rank"])
    report = Report(f"Peak memory growth per rank, 784-4096-4096-10 MLP, {results['none']['steps']} steps "
                    f"(one copy of the gradients = {grad / 2**20:.0f} MB)",
                    ["variant", "peak RSS growth MB", "extra over baseline MB", "extra, in gradient copies"],
                    note="growth: peak RSS after training minus RSS before wrapping the model (max over ranks)")
    for variant, label in MEMORY_VARIANTS.items():
        growth = max(results[variant]["growth_bytes_per_rank"])
        report.rows.append([label, f"{growth / 2**20:.0f}", f"{(growth - base) / 2**20:.0f}",
                            f"{(growth - base) / grad:.2f}"])
    return [report]


def checks(quick: bool) -> list[Report]:
    r = launch("check_overhead.py", "check_overhead", "--rounds", 8 if quick else 20, "--max-mb", 1 if quick else 16)
    steps = Report(f"Reliability checks on DataParallel steps, mlp, {r['ranks']} ranks x {r['per_rank_batch']} "
                   f"samples, {r['rounds']} rounds of {r['block']}-step blocks",
                   ["engine", "variant", "step ms", "overhead vs neither"],
                   note="collective check: one 33-integer allreduce per step before the buckets move; numerical "
                        "guard: one sum per bucket after them; overhead: median over rounds of the round's ratio")
    for row in r["dp"]:
        steps.rows.append([row["engine"], row["variant"], f"{row['step_ms']:.2f}", f"{row['overhead']:+.1%}"])
    calls = Report(f"Collective check on one blocking allreduce (sum, fp32), {r['ranks']} ranks",
                   ["engine", "size", "calls/block", "checked us", "unchecked us", "overhead"],
                   note="checked: the 33-integer check exchange, then the data; medians of interleaved blocks, "
                        "slower rank; overhead: median over rounds of the round's ratio")
    for row in r["allreduce"]:
        calls.rows.append([row["engine"], size_label(row["bytes"]) if row["bytes"] >= 1024 else f"{row['bytes']} B",
                           str(row["calls"]), f"{row['checked_us']:.1f}", f"{row['unchecked_us']:.1f}",
                           f"{row['overhead']:+.0%}"])
    return [steps, calls]


def handoff(quick: bool) -> list[Report]:
    r = launch("handoff.py", "handoff", "--rounds", 6 if quick else 15)
    report = Report(f"Handing a collective to the engine, {r['ranks']} ranks over MPI: a Python thread (before "
                    "issue 23) vs the engine's nonblocking call begun on the caller's thread",
                    ["measured", "thread", "caller's thread"],
                    note="posting: what one 16 KB allreduce posted under a chain of 8 matrix products adds to it "
                         "(median over rounds, ranks' mean); the rest: medians of single postings")
    report.rows += [["one posting adds to the chain, us", f"{r['posting_cost_us']['thread']:.1f}",
                     f"{r['posting_cost_us']['caller']:.1f}"],
                    ["wake-up (submission to the job starting), us", f"{r['thread_wakeup_us']:.1f}", "-"],
                    ["CPU the thread spends per collective, us", f"{r['thread_cpu_per_collective_us']:.1f}", "-"],
                    ["beginning it (with the check exchange), us", "-", f"{r['caller_begin_us']:.1f}"],
                    ["one progress() (MPI_Test), us", "-", f"{r['caller_progress_us']:.1f}"]]
    return [report]


BENCHMARKS = {"dp": dp_vs_ddp, "overlap": overlap, "busbw": busbw, "handoff": handoff, "memory": memory,
              "checks": checks}


def machine() -> dict:
    """What the numbers were measured on."""
    import mpi4py
    import torch
    from mpi4py import MPI

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().split(",")[0].strip(),
            "cuda": torch.cuda.is_available(), "loadavg_before": os.getloadavg()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer rounds and sizes (about half the time)")
    p.add_argument("--only", choices=list(BENCHMARKS), action="append", help="run only these (repeatable)")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    info = machine()
    start = time.time()
    markdown = []
    for name, bench in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        for report in bench(args.quick):
            console.print(report.rich())
            markdown.append(report.markdown())
    info.update(loadavg_after=os.getloadavg(), seconds=round(time.time() - start),
                command=" ".join(["benchmarks/run_all.py", *sys.argv[1:]]))
    (RESULTS / "machine.json").write_text(json.dumps(info, indent=2))
    (RESULTS / "tables.md").write_text("\n".join(markdown))
    console.print(f"{info['cpu']}, {info['cores']} cores, load {info['loadavg_before'][0]:.1f} -> "
                  f"{info['loadavg_after'][0]:.1f}; {info['seconds']} s. Tables: {RESULTS / 'tables.md'}")


if __name__ == "__main__":
    main()
