"""Peak memory per rank: gpurig.DataParallel vs torch DDP vs no data parallelism at all.

CPU tensors have no allocator counter, so each variant runs in its own job and
reports the growth of its peak resident set (``ru_maxrss``) over the resident
set just before training starts, on a model big enough (784-4096-4096-10, 20 M
parameters, 80 MB of fp32 gradients) for the gradients to dominate the noise.

    gpurig run -n 2 -- python benchmarks/memory.py --variant gpurig --out /tmp/mem.json
"""

import argparse
import json
import resource

import psutil
import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from engines import both_engines

VARIANTS = ("single", "gpurig-mpi", "gpurig-gloo", "ddp-gloo")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=VARIANTS, required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mpi, gloo = both_engines()
    torch.manual_seed(0)
    model = models.mlp(hidden=4096)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    before = psutil.Process().memory_info().rss
    if args.variant == "gpurig-mpi":
        model = gpurig.DataParallel(model, mpi)
    elif args.variant == "gpurig-gloo":
        model = gpurig.DataParallel(model, gloo)
    elif args.variant == "ddp-gloo":
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(args.steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    growth = torch.tensor([float(peak - before)], dtype=torch.float64)
    everyone = mpi.allgather(growth)
    if mpi.rank == 0:
        with open(args.out, "w") as f:
            json.dump({"variant": args.variant, "gradient_bytes": gradient_bytes,
                       "growth_bytes_per_rank": everyone.tolist()}, f)


if __name__ == "__main__":
    main()
