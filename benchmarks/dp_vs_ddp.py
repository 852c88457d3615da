"""Training step time: gpurig.DataParallel vs torch DistributedDataParallel, in one job.

Variants share the ranks, the model, the batches and the noise: each round runs
one step of every variant (in a rotating order), the first rounds are warm-up,
and each variant's median step time is reported. Also measured: how
much of the gradient allreduce DataParallel hides under the backward pass
(exposed wait at the end of backward vs the same buckets allreduced alone).

    gpurig run -n 2 -- python benchmarks/dp_vs_ddp.py --model mlp --out /tmp/dp.json
"""

import argparse
import copy
import json

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from engines import both_engines, median, timed


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp")
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    mpi, gloo = both_engines()
    torch.manual_seed(0)
    base = models.build(args.model)
    g = torch.Generator().manual_seed(mpi.rank)
    x = torch.randn(args.per_rank_batch, 784, generator=g)
    y = torch.randint(0, 10, (args.per_rank_batch,), generator=g)

    def step_fn(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    variants = {
        "gpurig DataParallel / gloo": gpurig.DataParallel(copy.deepcopy(base), gloo),
        "torch DDP / gloo": DDP(copy.deepcopy(base)),
        "gpurig DataParallel / mpi": gpurig.DataParallel(copy.deepcopy(base), mpi),
        "gpurig DataParallel / gloo, 1 MB buckets": gpurig.DataParallel(copy.deepcopy(base), gloo, bucket_cap_mb=1),
        "torch DDP / gloo, 1 MB buckets": DDP(copy.deepcopy(base), bucket_cap_mb=1),
    }
    steps = {name: step_fn(model) for name, model in variants.items()}
    names = list(variants)
    # Buckets allreduced with nothing to hide under, for the hidden fraction.
    alone_fns = {name: (lambda m=model, flats=[b.flat.clone() for b in model.buckets]:
                        [m.comm.allreduce(f, op="sum") for f in flats])
                 for name, model in variants.items() if hasattr(model, "buckets")}
    times = {name: [] for name in names}
    exposed = {name: [] for name in alone_fns}
    alone = {name: [] for name in alone_fns}
    # One step of each variant per round, in an order that rotates: noise lasting longer
    # than a few steps hits every variant alike.
    for rnd in range(args.warmup + args.rounds):
        order = names[rnd % len(names):] + names[: rnd % len(names)]
        for name in order:
            [t] = timed(steps[name], 1)
            if rnd >= args.warmup:
                times[name].append(t)
                if name in exposed:
                    exposed[name].append(variants[name].stats.last_exposed_s)
        for name, fn in alone_fns.items():
            [t] = timed(fn, 1)
            if rnd >= args.warmup:
                alone[name].append(t)

    if mpi.rank == 0:
        result = {"model": args.model, "ranks": mpi.size, "per_rank_batch": args.per_rank_batch,
                  "parameters": sum(p.numel() for p in base.parameters()), "variants": {}}
        for name in variants:
            t = median(times[name])
            row = {"step_ms": 1000 * t, "samples_per_s": mpi.size * args.per_rank_batch / t}
            if name in alone:
                row["exposed_ms"] = 1000 * median(exposed[name])
                row["allreduce_alone_ms"] = 1000 * median(alone[name])
                row["hidden_fraction"] = max(0.0, 1 - median(exposed[name]) / median(alone[name]))
                row["buckets"] = len(variants[name].buckets)
            result["variants"][name] = row
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
