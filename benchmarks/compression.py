"""Compression over a slow network, measured: run the codec benchmarks and print their tables.

    .venv/bin/python benchmarks/compression.py            # needs root (network namespaces)

1. Encode + decode throughput per codec on this CPU (fraction of memcpy).
2. Two emulated nodes x 1 rank behind a 1 Gbit/s link, then a 10 Gbit/s link:
   the source's MLP, one step per codec per round; step time, samples/s, bytes
   each rank sent per step (read from the interface counters), speed-up vs
   uncompressed and vs fp16.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from gpurig.launch.emulator import Cluster

HERE = Path(__file__).parent
RESULTS = HERE / "results"
console = Console(width=None if sys.stdout.isatty() else 150)


def codec_table() -> None:
    out = RESULTS / "codec_throughput.json"
    subprocess.run([sys.executable, str(HERE / "codec_throughput.py"), "--out", str(out)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = json.loads(out.read_text())
    table = Table(title=f"Codec encode (with error feedback) + decode, {result['values'] / 1e6:.1f} M float32 "
                        f"values, one thread (memcpy {result['memcpy_gb_per_s']:.1f} GB/s"
                        f"{', int8 in C' if result.get('native_kernels') else ''})")
    for col in ("codec", "wire MB", "encode ms", "decode ms", "GB/s", "of memcpy"):
        table.add_column(col, justify="right")
    for name, row in result["codecs"].items():
        if name == "none":
            continue
        table.add_row(name, f"{row['wire_bytes'] / 1e6:.2f}", f"{row['encode_ms']:.1f}", f"{row['decode_ms']:.1f}",
                      f"{row['gb_per_s']:.2f}", f"{row['fraction_of_memcpy']:.1%}")
    console.print(table)


def emulated_table(rate: str, rounds: int, engine: str) -> None:
    out = RESULTS / f"compression-{rate}-{engine}.json"
    with Cluster(nodes=2, rate=rate) as cluster:
        code = cluster.run([sys.executable, str(HERE / "compression_emulated.py"), "--rounds", str(rounds),
                            "--out", str(out)], engine=engine)
    if code:
        raise SystemExit(code)
    result = json.loads(out.read_text())
    rows = result["codecs"]
    table = Table(title=f"2 emulated nodes x 1 rank, {rate} link, {result['engine']}, MLP, "
                        f"{result['per_rank_batch']} samples per rank")
    for col in ("codec", "step ms", "samples/s", "vs none", "vs fp16", "MB sent per step (measured)"):
        table.add_column(col, justify="right")
    for name, row in rows.items():
        if name == "auto":
            name = f"auto (chose {', '.join(row['methods'])})"
        table.add_row(name, f"{row['step_ms']:.1f}", f"{row['samples_per_s']:.0f}",
                      f"{rows['none']['step_ms'] / row['step_ms']:.2f}x",
                      f"{rows['fp16']['step_ms'] / row['step_ms']:.2f}x", f"{row['bytes_sent_per_step'] / 1e6:.2f}")
    console.print(table)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--engine", default="mpi")
    args = p.parse_args()
    RESULTS.mkdir(exist_ok=True)
    codec_table()
    for rate in ("1gbit", "10gbit"):
        emulated_table(rate, args.rounds, args.engine)


if __name__ == "__main__":
    main()
