"""What gpurig's reliability checks cost: the collective check and the numerical guard, on and off, in one job.

Two parts, both engines (MPI through gpurig, Gloo beside it, as in common.both_engines):

- training steps of gpurig.DataParallel on the source's MLP: the default (every
  step's bucket allreduces checked against the other ranks' with one tiny
  exchange, and one sum per bucket for NaN/Inf), without the collective check,
  without the numerical guard, without either;
- blocking ``comm.allreduce`` of one tensor, 4 B to 16 MB, checked (one extra
  33-integer allreduce before the data moves) and unchecked.

Each engine's variants take turns in blocks, in a new order every round
(``common.interleave`` with a seeded shuffle: with a fixed rotation, each block
always follows the same one, and what it inherits from it, threads to wake on
this VM, showed as a 20 % difference between identical variants); a block lasts
as long as its slower rank; reported are medians and, for the overhead, the
median over rounds of each round's ratio to the unchecked variant of that round.

    gpurig run -n 2 -- python benchmarks/check_overhead.py --out /tmp/checks.json
"""

import argparse
import copy
import random

import torch

import gpurig
from gpurig import models
from common import batches, both_engines, interleave, median, paired_ratio, slowest_rank, training_block, write_result

SIZES = [4, 1024, 64 * 1024, 2**20, 16 * 2**20]
DP_VARIANTS = {  # name -> (collective check, numerical guard)
    "checks + guard (default)": (True, "stop"),
    "no collective check": (False, "stop"),
    "no numerical guard": (True, "ignore"),
    "neither": (False, "ignore"),
}


def checked(comm, on: bool, block):
    """``block`` run with the communicator's collective check ``on`` (every rank runs the same blocks in turn)."""
    def run():
        comm.guard.check = on
        try:
            block()
        finally:
            comm.guard.check = True
    return run


def allreduce_block(comm, tensor: torch.Tensor, calls: int):
    def run():
        for _ in range(calls):
            comm.allreduce(tensor, op="sum", name="t")
    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--block", type=int, default=5, help="training steps per block")
    p.add_argument("--max-mb", type=float, default=16)
    p.add_argument("--seed", type=int, default=0, help="seed of the block order")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    mpi, gloo = both_engines()
    torch.manual_seed(0)
    base = models.build("mlp")
    data = batches(args.block, 64, mpi.rank)
    order = random.Random(args.seed)  # the same on every rank
    sizes = [s for s in SIZES if s <= args.max_mb * 2**20]
    seconds, steps = {}, {}
    for comm in (mpi, gloo):  # one group per engine, so that no block pays for waking the other engine
        blocks = {}
        for name, (check, guard) in DP_VARIANTS.items():
            model = gpurig.DataParallel(copy.deepcopy(base), comm, nonfinite=guard)
            blocks[f"dp|{comm.engine_name}|{name}"] = checked(comm, check, training_block(model, data))
        for size in sizes:
            tensor = torch.ones(max(1, size // 4))
            calls = max(2, min(200, 2**22 // size))  # about 4 MB moved per block, at least 2 calls
            steps[size] = calls
            for check in (True, False):
                blocks[f"ar|{comm.engine_name}|{size}|{check}"] = checked(comm, check,
                                                                           allreduce_block(comm, tensor, calls))
        for name, s in interleave(blocks, args.rounds, args.warmup, shuffle=order).items():
            seconds[name] = slowest_rank(mpi, s)

    dp_rows, ar_rows = [], []
    for comm in (mpi, gloo):
        engine = comm.engine_name
        reference = seconds[f"dp|{engine}|neither"]
        for name in DP_VARIANTS:
            mine = seconds[f"dp|{engine}|{name}"]
            dp_rows.append({"engine": engine, "variant": name, "step_ms": 1e3 * median(mine) / args.block,
                            "overhead": paired_ratio(mine, reference) - 1})
        for size in sizes:
            on, off = seconds[f"ar|{engine}|{size}|True"], seconds[f"ar|{engine}|{size}|False"]
            ar_rows.append({"engine": engine, "bytes": size, "calls": steps[size],
                            "checked_us": 1e6 * median(on) / steps[size], "unchecked_us": 1e6 * median(off) / steps[size],
                            "overhead": paired_ratio(on, off) - 1})
    write_result(mpi, args.out, {"ranks": mpi.size, "rounds": args.rounds, "warmup": args.warmup,
                                 "block": args.block, "per_rank_batch": 64, "dp": dp_rows, "allreduce": ar_rows})


if __name__ == "__main__":
    main()
