"""Training step time: gpurig.DataParallel vs torch DistributedDataParallel, in one job.

Every variant trains its own copy of the same model, with the same batches, on
the same 2 ranks. They take turns in blocks of steps (one block of each per
round, rotating order, warm-up rounds dropped), so the noise of a shared
machine hits all of them. A block's time is its slowest rank's; reported are
the median step time over blocks, samples/s, and the throughput ratio against
DDP with the same bucket size, taken round by round (see ``common.paired_ratio``).

Variants: gpurig over Gloo and DDP over Gloo share torch.distributed's default
process group; gpurig over MPI is the extra row; the same pair again with 1 MB
buckets, where per-bucket overhead shows.

    gpurig run -n 2 -- python benchmarks/dp_vs_ddp.py --model mlp --out /tmp/dp.json
"""

import argparse
import copy

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from common import both_engines, interleave, median, paired_ratio, slowest_rank, spread, write_result


def batches(count: int, per_rank: int, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` random MNIST-shaped batches, different on each rank, the same for every variant."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(per_rank, 784, generator=g), torch.randint(0, 10, (per_rank,), generator=g))
            for _ in range(count)]


def training_block(model: torch.nn.Module, data) -> callable:
    """A function that runs one SGD step (momentum 0.9) per batch of ``data``."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def block():
        for x, y in data:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    return block


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=list(models.MODELS), default="mlp")
    p.add_argument("--per-rank-batch", type=int, default=64)
    p.add_argument("--block", type=int, default=5, help="steps per block")
    p.add_argument("--rounds", type=int, default=20, help="measured rounds (one block of every variant each)")
    p.add_argument("--warmup", type=int, default=2, help="rounds dropped at the start")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    mpi, gloo = both_engines()
    torch.manual_seed(0)
    base = models.build(args.model)
    data = batches(args.block, args.per_rank_batch, mpi.rank)
    # name -> (model, the DDP variant it is compared with)
    variants = {
        "gpurig / gloo": (gpurig.DataParallel(copy.deepcopy(base), gloo), "DDP / gloo"),
        "DDP / gloo": (DDP(copy.deepcopy(base)), "DDP / gloo"),
        "gpurig / mpi": (gpurig.DataParallel(copy.deepcopy(base), mpi), "DDP / gloo"),
        "gpurig / gloo, 1 MB buckets": (gpurig.DataParallel(copy.deepcopy(base), gloo, bucket_cap_mb=1),
                                        "DDP / gloo, 1 MB buckets"),
        "DDP / gloo, 1 MB buckets": (DDP(copy.deepcopy(base), bucket_cap_mb=1), "DDP / gloo, 1 MB buckets"),
    }
    blocks = {name: training_block(model, data) for name, (model, _) in variants.items()}
    seconds = interleave(blocks, args.rounds, args.warmup)
    seconds = {name: slowest_rank(mpi, s) for name, s in seconds.items()}

    global_batch = mpi.size * args.per_rank_batch
    rows = {}
    for name, (_, reference) in variants.items():
        step = median(seconds[name]) / args.block
        rows[name] = {"step_ms": 1e3 * step, "samples_per_s": global_batch / step,
                      "spread": spread(seconds[name]), "compared_with": reference,
                      # throughput ratio = DDP's time / ours, round by round
                      "vs_ddp": paired_ratio(seconds[reference], seconds[name])}
    write_result(mpi, args.out, {
        "model": args.model, "parameters": sum(p.numel() for p in base.parameters()),
        "ranks": mpi.size, "per_rank_batch": args.per_rank_batch, "block": args.block,
        "rounds": args.rounds, "warmup": args.warmup, "variants": rows})


if __name__ == "__main__":
    main()
