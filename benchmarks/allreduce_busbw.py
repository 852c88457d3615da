"""Allreduce bandwidth of gpurig's Communicator vs the raw engine call, nccl-tests style.

For each message size (1 KB to 256 MB, fp32, powers of 4) and each engine, the
raw call and ``comm.allreduce(t, op="sum")`` are timed as nccl-tests times a
collective, loops of 16 back-to-back in-place calls on the same tensor after a
warm-up, the loops taking turns (``common.interleave``: the order rotating
every round), so noise hits all alike; a third loop times ``comm.allreduce`` with the
Communicator's check that the ranks call the same collective turned off
(``comm.guard.check = False``), to show what that check costs:

- MPI: ``MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, [t.numpy(), MPI.FLOAT])``, the
  numpy view made once, outside the timing (the leanest mpi4py call there is);
- Gloo: ``torch.distributed.all_reduce(t)``.

Reported per size: median time of each, algbw = bytes / time, busbw = algbw ×
2(n−1)/n (nccl-tests' definitions, from gpurig.perf.busbw; for a ring that is what each link carries),
and gpurig/raw of busbw (the median of the loops' ratios). Each loop is timed
on every rank and the slower rank's time counts.

    gpurig run -n 2 -- python benchmarks/allreduce_busbw.py --max-mb 16 --out /tmp/busbw.json
"""

import argparse

import torch
import torch.distributed as dist
from mpi4py import MPI

from common import both_engines, interleave, median, slowest_rank, spread, write_result
from gpurig.measure.comm import loop_shape
from gpurig.perf.busbw import busbw

KB = 1024
PER_LOOP = 16  # back-to-back calls per timed loop


def sizes(max_bytes: int) -> list[int]:
    """1 KB, 4 KB, … up to ``max_bytes``.

    >>> sizes(64 * 1024)
    [1024, 4096, 16384, 65536]
    """
    out, size = [], KB
    while size <= max_bytes:
        out.append(size)
        size *= 4
    return out


def iterations(nbytes: int, budget_bytes: float) -> int:
    """Calls of each variant to time: about ``budget_bytes`` of traffic per size, 10 to 400 of them.

    >>> iterations(1024, 2**29), iterations(2**20, 2**29), iterations(256 * 2**20, 2**29)
    (400, 400, 10)
    """
    return max(10, min(400, int(budget_bytes // nbytes)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-mb", type=int, default=256)
    p.add_argument("--budget-mb", type=float, default=512, help="traffic per size and variant (sets iterations)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mpi, gloo = both_engines()
    world = MPI.COMM_WORLD

    rows = []
    for nbytes in sizes(args.max_mb * 2**20):
        t = torch.zeros(nbytes // 4)
        view = [t.numpy(), MPI.FLOAT]
        calls = {
            "mpi": (lambda: world.Allreduce(MPI.IN_PLACE, view, op=MPI.SUM), lambda: mpi.allreduce(t, op="sum")),
            "gloo": (lambda: dist.all_reduce(t), lambda: gloo.allreduce(t, op="sum")),
        }
        n = iterations(nbytes, args.budget_mb * 2**20)
        loops, _ = loop_shape(n, PER_LOOP)
        for engine, (raw, ours) in calls.items():
            comm = mpi if engine == "mpi" else gloo

            def unchecked():
                comm.guard.check = False
                try:
                    ours()
                finally:
                    comm.guard.check = True

            def loop(fn):
                def run():
                    for _ in range(PER_LOOP):
                        fn()
                return run

            for _ in range(3):  # warm-up
                raw(), ours(), unchecked()
            seconds = interleave({"raw": loop(raw), "gpurig": loop(ours), "unchecked": loop(unchecked)},
                                 rounds=loops, warmup=0)
            raw_t, our_t, free_t = ([s / PER_LOOP for s in slowest_rank(mpi, seconds[k])]
                                    for k in ("raw", "gpurig", "unchecked"))
            raw_s, our_s = median(raw_t), median(our_t)
            rows.append({"engine": engine, "bytes": nbytes, "iterations": loops * PER_LOOP,
                         "raw_spread": spread(raw_t), "gpurig_spread": spread(our_t),
                         "raw_us": 1e6 * raw_s, "gpurig_us": 1e6 * our_s, "unchecked_us": 1e6 * median(free_t),
                         "raw_busbw_gbps": busbw("allreduce", nbytes, raw_s, mpi.size) / 1e9,
                         "gpurig_busbw_gbps": busbw("allreduce", nbytes, our_s, mpi.size) / 1e9,
                         "ratio": median([r / o for r, o in zip(raw_t, our_t)]),
                         "unchecked_ratio": median([r / o for r, o in zip(raw_t, free_t)])})
    write_result(mpi, args.out, {"ranks": mpi.size, "dtype": "float32", "rows": rows})


if __name__ == "__main__":
    main()
