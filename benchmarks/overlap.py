"""How much of the gradient allreduce gpurig.DataParallel hides under the backward pass.

For each engine (Gloo, MPI) and bucket size (the default 25 MB, and 1 MB) two
blocks alternate, round by round:

- *train*: a block of training steps; per step, ``dp.stats`` records the time
  the end of backward waited for the allreduces (``exposed``);
- *alone*: the same buckets (same sizes, same order, issued asynchronously and
  then waited on, exactly as backward issues them) allreduced with no compute.

A third block trains the bare model (no communication) for the step time
without data parallelism.

hidden = 1 − exposed / alone: 0 when backward's end waits as long as the
allreduces take on their own, 1 when they finish under the computation.
A rank that finishes backward first also waits for the other one to finish
its own; the rank that finishes last waits for communication only. So per
block the least wait over the ranks counts as ``exposed``; its median over
blocks is reported. On a CPU, communication needs the same cores as the
computation (shared-memory copies, loopback TCP), so ``exposed`` can exceed
``alone`` and the fraction go below 0.

    gpurig run -n 2 -- python benchmarks/overlap.py --model mlp --out /tmp/overlap.json
"""

import copy

import torch

import gpurig
from gpurig import models
from common import (batches, both_engines, interleave, median, per_rank, slowest_rank, step_benchmark_args,
                    training_block, write_result)


def allreduce_alone(dp: gpurig.DataParallel) -> callable:
    """A function that allreduces copies of ``dp``'s buckets the way backward does, with nothing to hide under."""
    flats = [torch.zeros_like(bucket.flat) for bucket in dp.buckets]

    def run():
        handles = [dp.comm.allreduce_async(flat, op="sum") for flat in flats]
        for handle in handles:
            handle.wait()
    return run


def main():
    p = step_benchmark_args(__doc__, block_help="steps (and allreduce rounds) per block")
    args = p.parse_args()

    mpi, gloo = both_engines()
    torch.manual_seed(0)
    base = models.build(args.model)
    data = batches(args.block, args.per_rank_batch, mpi.rank)
    variants = {f"{engine}, {mb:g} MB buckets": gpurig.DataParallel(copy.deepcopy(base), comm, bucket_cap_mb=mb)
                for engine, comm in (("gloo", gloo), ("mpi", mpi)) for mb in (25, 1)}

    blocks = {"no data parallelism": training_block(copy.deepcopy(base), data)}
    exposed = {name: [] for name in variants}
    for name, dp in variants.items():
        train = training_block(dp, data)

        def train_and_record(dp=dp, train=train, name=name):
            before = dp.stats.exposed_s
            train()
            exposed[name].append(dp.stats.exposed_s - before)

        alone = allreduce_alone(dp)
        blocks[name + " train"] = train_and_record
        blocks[name + " alone"] = lambda alone=alone: [alone() for _ in range(args.block)]
    seconds = interleave(blocks, args.rounds, args.warmup)

    rows = {}
    for name, dp in variants.items():
        step = median(slowest_rank(mpi, seconds[name + " train"])) / args.block
        alone = median(slowest_rank(mpi, seconds[name + " alone"])) / args.block
        # Per block, the rank that reached the end of backward last waited only for communication;
        # the others also waited for it. So the least wait over ranks is the exposed communication.
        waits = per_rank(mpi, exposed[name][args.warmup:])
        waited = median([min(column) for column in zip(*waits)]) / args.block
        rows[name] = {"buckets_mb": [b.flat.numel() * b.flat.element_size() / 2**20 for b in dp.buckets],
                      "step_ms": 1e3 * step, "alone_ms": 1e3 * alone, "exposed_ms": 1e3 * waited,
                      "exposed_ms_per_rank": [1e3 * median(w) / args.block for w in waits],
                      "hidden": 1 - waited / alone}
    no_dp_ms = 1e3 * median(slowest_rank(mpi, seconds["no data parallelism"])) / args.block
    write_result(mpi, args.out, {
        "model": args.model, "step_ms_without_dp": no_dp_ms, "parameters": sum(p.numel() for p in base.parameters()),
        "ranks": mpi.size, "per_rank_batch": args.per_rank_batch, "block": args.block,
        "rounds": args.rounds, "variants": rows})


if __name__ == "__main__":
    main()
