"""``gpurig bench`` on the command line: a progress bar while it measures, then tables, plots and the profile."""

from __future__ import annotations

import argparse
import json

from gpurig.cli.common import HelpFormatter, WIDE_COLUMNS

EPILOG = """\
examples:
  gpurig bench --quick                           # every part, small sizes (about a minute)
  gpurig bench -n 2 --engine mpi,torch           # collectives over MPI and over torch.distributed
  gpurig bench --parts comm --max-mb 256         # only the collectives, up to 256 MB
  gpurig bench --plot runs/bench                 # PNG plots next to the profile
  gpurig bench --quick --json | jq .comm         # the profile on stdout

Collectives are reported as nccl-tests does: algbw = bytes / time and busbw =
algbw x 2(n-1)/n for allreduce, (n-1)/n for allgather, 1 for broadcast and
point-to-point; times are per call of loops of back-to-back in-place calls
after a warm-up, as nccl-tests times them; 'raw' is the engine's own call
(mpi4py Allreduce(IN_PLACE), torch.distributed.all_reduce ...) timed the same
way, loop about with gpurig's; gpurig/raw is the median of their ratios. alpha
(latency) and beta (seconds per byte) are fitted to time = alpha + bytes x beta.
The machine profile (JSON, schema in docs/hardware.md) is what gpurig predict
calibrates from.
"""


def add_parser(subparsers) -> None:
    """Register ``gpurig bench``."""
    from gpurig.measure.bench import PARTS

    p = subparsers.add_parser(
        "bench", help="measure collectives (algbw/busbw, alpha-beta), GEMMs, host-device copies, loading, disk",
        description="Measure this machine: collectives across ranks by message size, point-to-point bandwidth, "
                    "GEMM throughput by batch size, host<->device copies (GPU), data loading and disk reads; save "
                    "a machine profile.",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("-n", "--nprocs", type=int, default=2, help="ranks for the communication parts (default 2)")
    p.add_argument("--engine", default="mpi", help="mpi, torch, or both as mpi,torch (default mpi)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"which parts to run (default all): {','.join(PARTS)}")
    p.add_argument("--quick", action="store_true", help="small sizes and few iterations")
    p.add_argument("--repeat", type=int, default=1,
                   help="take the compute and gemm parts N times, turn about, and keep each number's median "
                        "(for a shared machine whose speed drifts; default 1)")
    p.add_argument("--min-kb", type=float, default=None, help="smallest message in KB (default 1)")
    p.add_argument("--max-mb", type=float, default=None, help="largest message in MB (default 64; 1 with --quick)")
    p.add_argument("--dir", default=None, help="directory for the disk and loading files (default: the temp dir)")
    p.add_argument("--mpi-args", default="", help="extra mpirun arguments")
    p.add_argument("--out", default="runs/bench/profile.json", help="where to write the machine profile")
    p.add_argument("--plot", metavar="DIR", default=None, help="write PNG plots to DIR")
    p.add_argument("--json", action="store_true", help="print the profile as JSON instead of tables")
    p.set_defaults(handler=run)


def _config(args):
    from gpurig.errors import check_directory, check_writable
    from gpurig.measure.bench import BenchConfig

    check_writable(args.out, "--out", make_directory=True)  # before minutes of measuring, not after (made then)
    if args.plot is not None:
        check_directory(args.plot, "--plot")  # a directory of PNGs, made once the flags are checked; --dir: validate()

    overrides = {"nprocs": args.nprocs, "engines": tuple(e.strip() for e in args.engine.split(",") if e.strip()),
                 "parts": tuple(x.strip() for x in args.parts.split(",") if x.strip()), "directory": args.dir,
                 "mpi_args": args.mpi_args, "repeat": args.repeat}
    if args.min_kb is not None:
        overrides["min_bytes"] = _size_flag(args.min_kb, "--min-kb", 1024)
    if args.max_mb is not None:
        overrides["max_bytes"] = _size_flag(args.max_mb, "--max-mb", 2**20)
    return BenchConfig.quick_config(**overrides) if args.quick else BenchConfig(**overrides)


def _size_flag(value: float, flag: str, unit: int) -> int:
    """A message size flag in bytes; one line for what is not a positive size up to 16 GB.

    >>> _size_flag(float("nan"), "--min-kb", 1024)
    Traceback (most recent call last):
    ...
    gpurig.errors.UsageError: --min-kb must be a positive size up to 16 GB, got nan
    """
    from gpurig.errors import UsageError

    if not 0 < value * unit <= 16 * 2**30:
        raise UsageError(f"{flag} must be a positive size up to 16 GB, got {value:g}")
    return int(value * unit)


def _expected_rows(config) -> int:
    from gpurig.measure.comm import sizes

    per_engine = len(sizes(config.min_bytes, config.max_bytes)) * (
        (len(config.collectives) if "comm" in config.parts else 0) + ("p2p" in config.parts))
    return per_engine * len(config.engines)


def run(args) -> int:
    """Run ``gpurig bench``; return 0."""
    from pathlib import Path

    from gpurig.errors import UsageError, check_directory
    from gpurig.measure.bench import bench, validate

    config = _config(args)
    validate(config)
    if args.plot is not None:
        check_directory(args.plot, "--plot", make=True)
    if args.json:
        profile = bench(config)
    else:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console()
        console.print(f"[bold]gpurig bench[/]: parts {', '.join(config.parts)}; {config.nprocs} ranks over "
                      f"{', '.join(config.engines)}{' (quick)' if config.quick else ''}")
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("starting", total=_expected_rows(config) or None)

            def on_event(event):
                if event["event"] == "part":
                    progress.update(task, description=event["part"])
                elif event["event"] == "row":
                    progress.update(task, advance=1,
                                    description=f"{event['engine']} {event['collective']} {_size(event['bytes'])}")

            profile = bench(config, on_event)
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(profile, indent=2))
    except OSError as error:   # a disk filled while measuring: keep the minutes' work on stdout
        print(json.dumps(profile, indent=2))
        raise UsageError(f"--out {out}: cannot write it ({error.strerror or error}); the profile is printed above "
                         "instead") from None
    plots = write_plots(profile, args.plot) if args.plot else []
    if args.json:
        print(json.dumps(profile, indent=2))
    else:
        show(profile, out, plots)
    return 0


def _size(nbytes: float) -> str:
    """Bytes as the shortest of B, KB, MB (binary, as message sizes are).

    >>> _size(1024), _size(4 << 20), _size(100)
    ('1 KB', '4 MB', '100 B')
    """
    for unit, scale in (("MB", 2**20), ("KB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def show(profile: dict, out, plots: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    from rich import box

    console = Console()
    # below 120 columns: no lines, no algbw (busbw is the one nccl-tests compares), codecs' chains by the codec's
    # name, so that every number shows whole in an 80-column terminal
    wide = console.width >= WIDE_COLUMNS
    for engine, collectives in profile.get("comm", {}).get("engines", {}).items():
        table = Table(title=f"{engine}, {profile['comm']['ranks']} ranks: time (µs), "
                            + ("algbw and busbw" if wide else "busbw") + " (GB/s); raw = the engine's own call"
                            + ("" if wide else "; codec: its whole compressed average"),
                      title_justify="left", box=box.HEAVY_HEAD if wide else box.SIMPLE_HEAD,
                      pad_edge=wide, collapse_padding=not wide)
        isolated = any("isolated_seconds" in row for e in collectives.values() for row in e["rows"])
        headers = ("collective", "size", "time") + (("algbw",) if wide else ()) + ("busbw", "raw busbw", "gpurig/raw")
        for header in headers + (("isolated time" if wide else "isolated",) if isolated else ()):
            table.add_column(header, justify="right", no_wrap=True)
        for name, entry in collectives.items():
            for row in entry["rows"]:
                raw = f"{row['raw_busbw_gbs']:.3f}" if "raw_busbw_gbs" in row else "-"
                ratio = f"{row['raw_over_gpurig']:.2f}" if "raw_over_gpurig" in row else "-"
                shown = name if wide else name.replace("compressed:", "codec ")
                cells = [shown, _size(row["bytes"]), f"{1e6 * row['seconds']:.1f}"]
                cells += [f"{row['algbw_gbs']:.3f}"] if wide else []
                cells += [f"{row['busbw_gbs']:.3f}", raw, ratio]
                if isolated:
                    cells.append(f"{1e6 * row['isolated_seconds']:.1f}" if "isolated_seconds" in row else "-")
                table.add_row(*cells)
        console.print(table)
        fits = "; ".join(f"{name}: alpha {1e6 * e['alpha_s']:.1f} µs, 1/beta "
                         + (f"{e['fitted_gbs']:.2f} GB/s" if e["fitted_gbs"] else "- (too noisy)")
                         for name, e in collectives.items() if "alpha_s" in e)
        console.print(f"fitted time = alpha + bytes × beta: {fits}")
        overlap = (profile["comm"].get("overlap") or {}).get(engine)
        if overlap:
            console.print(f"computing while a collective is in flight: a {1e3 * overlap['product_s']:.2f} ms matrix "
                          f"product takes {1e3 * overlap['product_during_s']:.2f} ms ({overlap['slowdown']:.2f}x)")
            if "posted_s" in overlap:
                console.print(f"posting a collective under computation costs it {1e3 * overlap['posted_s']:.2f} ms "
                              f"(a {1e3 * overlap['chain_s']:.1f} ms chain of products)")
        posting = "; ".join(f"{name.partition(':')[2]} {1e3 * e['posted_alpha_s']:.2f} ms + "
                            f"{1e9 * e['posted_beta_s_per_byte']:.2f} ms/MB"
                            for name, e in collectives.items() if "posted_alpha_s" in e)
        if posting:
            console.print(f"posting a compressed bucket under computation costs it, by gradient bytes: {posting}")
    if "gemm" in profile:
        table = Table(title=f"GEMM (batch × {profile['gemm']['rows'][0]['k']}) @ ({profile['gemm']['rows'][0]['k']}"
                            f" × {profile['gemm']['rows'][0]['n']}) fp32 on {profile['gemm']['device']}",
                      title_justify="left")
        for header in ("batch", "multiple of", "µs", "TFLOPS"):
            table.add_column(header, justify="right")
        for row in profile["gemm"]["rows"]:
            table.add_row(str(row["batch"]), str(row["multiple_of"]), f"{1e6 * row['seconds']:.1f}",
                          f"{row['tflops']:.3f}")
        console.print(table)
    if "host_device" in profile:
        hd = profile["host_device"]
        if not hd["available"]:
            console.print(f"host↔device copies: skipped ({hd['reason']})")
        else:
            table = Table(title=f"host↔device copies, {hd['device']} (GB/s)", title_justify="left")
            for header in ("direction", "memory", "size", "GB/s"):
                table.add_column(header, justify="right")
            for row in hd["rows"]:
                table.add_row(row["direction"], "pinned" if row["pinned"] else "pageable", _size(row["bytes"]),
                              f"{row['gbs']:.2f}")
            console.print(table)
    if "loading" in profile:
        ld = profile["loading"]
        console.print(f"data loading, {_size(ld['batch_bytes'])} batches: read {ld['load_ms']:.1f} ms + compute "
                      f"{ld['compute_ms']:.1f} ms; blocking {ld['blocking_ms']:.1f} ms/step, prefetching "
                      f"{ld['prefetch_ms']:.1f} ms/step")
    if "disk" in profile:
        dk = profile["disk"]
        console.print(f"disk read ({dk['directory']}, {_size(dk['bytes'])}, page cache "
                      f"{'dropped' if dk['cache_dropped'] else 'kept'}): {dk['mb_per_s']:.0f} MB/s")
    console.print(f"machine profile: {out}" + (f"; plots: {', '.join(plots)}" if plots else ""))


def write_plots(profile: dict, directory: str) -> list[str]:
    """PNG plots (matplotlib, Agg): busbw by size per engine and collective; GEMM TFLOPS by batch."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    engines = profile.get("comm", {}).get("engines", {})
    if engines:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for engine, collectives in engines.items():
            for name, entry in collectives.items():
                rows = entry["rows"]
                ax.plot([r["bytes"] for r in rows], [r["busbw_gbs"] for r in rows], marker="o",
                        label=f"{engine} {name}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"bus bandwidth, {profile['comm']['ranks']} ranks ({profile['host']})")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        path = out / "busbw.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(str(path))
    if "gemm" in profile:
        rows = profile["gemm"]["rows"]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        colors = ["tab:green" if r["multiple_of"] >= 32 else "tab:red" for r in rows]
        ax.bar([str(r["batch"]) for r in rows], [r["tflops"] for r in rows], color=colors)
        ax.set_xlabel("batch (green: multiple of 32)")
        ax.set_ylabel("TFLOPS")
        ax.set_title(f"GEMM throughput by batch, {profile['gemm']['device']}")
        path = out / "gemm.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(str(path))
    return written
