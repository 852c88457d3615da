"""Compressed gradients on CPU ranks: DataParallel's buckets (the first leaves while backward still runs)
against every gradient in one bucket, sent as backward ends.

On CPU ranks a compressed bucket's chain (encode, exchanges, decode, encode,
gather, decode) runs on the communication thread, on the cores backward needs.
Overlapping it with backward hides its wire time but slows backward beside it;
one bucket at the end hides nothing but slows nothing. This times both layouts
of the same model and codec, interleaved in blocks of steps (each block the
slower rank's), and prints the median step of each and their paired ratio.

    gpurig run -n 2 -- python benchmarks/compressed_bucket_layout.py --out /tmp/layout.json
    gpurig emulate --nodes 2 --rate 1gbit -- python benchmarks/compressed_bucket_layout.py --out /tmp/layout.json
"""

import argparse

from rich.console import Console
from rich.table import Table

import gpurig
import gpurig.parallel.data_parallel as data_parallel
from common import batches, interleave, median, paired_ratio, slowest_rank, training_block, write_result
from gpurig import models

ONE_BUCKET_MB = 1e6  # larger than any model here: every gradient in the first bucket


def build(comm, model: str, compression: str, one_bucket: bool) -> gpurig.DataParallel:
    """The model under DataParallel with its default buckets, or with every gradient in one."""
    first = data_parallel.FIRST_BUCKET_MB
    data_parallel.FIRST_BUCKET_MB = ONE_BUCKET_MB if one_bucket else first  # read once, when buckets are built
    try:
        net = models.build(model)
        return gpurig.DataParallel(net, comm, compression=compression,
                                   bucket_cap_mb=ONE_BUCKET_MB if one_bucket else None)
    finally:
        data_parallel.FIRST_BUCKET_MB = first


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=["cnn:int8", "cnn:powersgd", "mlp:int8", "mlp:powersgd"],
                   metavar="MODEL:CODEC", help="model and compression of each case")
    p.add_argument("--per-rank-batch", type=int, default=32)
    p.add_argument("--block", type=int, default=5, help="steps per block")
    p.add_argument("--rounds", type=int, default=8, help="measured rounds (one block of each layout each)")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped at the start")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    comm = gpurig.init()
    data = batches(args.block, args.per_rank_batch, comm.rank)
    rows = []
    for case in args.cases:
        model, _, codec = case.partition(":")
        layouts = {one: build(comm, model, codec, one) for one in (False, True)}
        seconds = interleave({one: training_block(net, data) for one, net in layouts.items()},
                             rounds=args.rounds, warmup=args.warmup)
        split, whole = (slowest_rank(comm, seconds[one]) for one in (False, True))
        rows.append({"model": model, "compression": codec, "buckets": len(layouts[False].buckets),
                     "buckets_ms": 1e3 * median(split) / args.block, "one_bucket_ms": 1e3 * median(whole) / args.block,
                     "one_bucket_speedup": paired_ratio(split, whole)})
    write_result(comm, args.out, {"ranks": comm.size, "per_rank_batch": args.per_rank_batch, "rows": rows})
    if comm.rank == 0:
        table = Table(title=f"ms per step, {comm.size} ranks, {args.per_rank_batch} per rank")
        for header in ("model", "codec", "buckets", "their step", "one bucket", "one is"):
            table.add_column(header, justify="left" if header in ("model", "codec") else "right")
        for r in rows:
            table.add_row(r["model"], r["compression"], str(r["buckets"]), f"{r['buckets_ms']:.1f}",
                          f"{r['one_bucket_ms']:.1f}", f"{r['one_bucket_speedup']:.2f}x")
        Console().print(table)


if __name__ == "__main__":
    main()
