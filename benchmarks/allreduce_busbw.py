"""Allreduce bandwidth of gpurig's Communicator vs the raw engine call, nccl-tests style.

For each message size and each engine (MPI via mpi4py, Gloo via torch.distributed)
the raw call and ``comm.allreduce(t, op="sum")`` alternate, iteration by
iteration, so noise hits both alike. Reported: median time, algbw = bytes /
time, busbw = algbw × 2(n−1)/n (nccl-tests' definitions), and gpurig/raw.

    gpurig run -n 2 -- python benchmarks/allreduce_busbw.py --out /tmp/busbw.json
"""

import argparse
import json

import torch
import torch.distributed as dist
from mpi4py import MPI

from engines import both_engines, median, timed

KB = 1024


def iterations(nbytes: int) -> int:
    """Enough repetitions for a stable median, few for the largest messages."""
    return max(5, min(200, int(2e8 // max(nbytes, 1))))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--max-mb", type=int, default=256)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mpi, gloo = both_engines()
    raw_mpi = MPI.COMM_WORLD
    sizes = []
    size = KB
    while size <= args.max_mb * KB * KB:
        sizes.append(size)
        size *= 4
    rows = []
    for nbytes in sizes:
        t = torch.ones(nbytes // 4)
        raw = {
            "mpi": lambda: raw_mpi.Allreduce(MPI.IN_PLACE, [t.numpy(), MPI.FLOAT], op=MPI.SUM),
            "gloo": lambda: dist.all_reduce(t),
        }
        ours = {"mpi": lambda: mpi.allreduce(t, op="sum"), "gloo": lambda: gloo.allreduce(t, op="sum")}
        for engine in ("mpi", "gloo"):
            n = iterations(nbytes)
            timed(raw[engine], 2)
            timed(ours[engine], 2)
            raw_times, our_times = [], []
            for i in range(n):
                first, second = (raw, ours) if i % 2 == 0 else (ours, raw)
                a, b = timed(first[engine], 1)[0], timed(second[engine], 1)[0]
                raw_times.append(a if first is raw else b)
                our_times.append(b if first is raw else a)
            factor = 2 * (mpi.size - 1) / mpi.size
            row = {"engine": engine, "bytes": nbytes, "iterations": n}
            for name, times in (("raw", raw_times), ("gpurig", our_times)):
                seconds = median(times)
                row[f"{name}_us"] = 1e6 * seconds
                row[f"{name}_busbw_gbps"] = nbytes / seconds * factor / 1e9
            row["ratio"] = row["gpurig_busbw_gbps"] / row["raw_busbw_gbps"]
            rows.append(row)
    if mpi.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"ranks": mpi.size, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
