"""Peak memory per rank: gpurig.DataParallel vs torch DDP vs no data parallelism at all.

CPU tensors have no allocator counter like ``torch.cuda.max_memory_allocated``,
so each variant runs in its own 2-rank job and reports how far its peak resident
set (``ru_maxrss``) grew over the resident set just before the model is wrapped,
after the same number of training steps. glibc is told to serve every block of
64 KB or more with its own mmap, so freed tensors leave the resident set at once
and the peak follows live memory rather than the allocator's caching.

The model is the MLP widened to 784-4096-4096-10 (20 M parameters, 76 MB of fp32
gradients) so that the gradients dominate everything else. Variants:

- ``none``: each rank trains alone, no collectives (the baseline);
- ``gpurig-mpi``, ``gpurig-gloo``: ``gpurig.DataParallel`` on either engine;
- ``ddp-gloo``: ``torch.nn.parallel.DistributedDataParallel``;
- ``flat-mpi``: the textbook minimum by hand, one flat gradient buffer, one
  in-place ``MPI_Allreduce`` after backward, copied back: what the MPI library
  itself adds beyond one copy of the gradients.

    gpurig run -n 2 -- python benchmarks/memory.py --variant gpurig-mpi --out /tmp/mem.json
"""

import argparse
import ctypes
import resource

import psutil
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from common import both_engines, write_result

VARIANTS = ("none", "gpurig-mpi", "gpurig-gloo", "ddp-gloo", "flat-mpi")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def mmap_large_blocks(threshold: int = 64 * 1024) -> None:
    """Make glibc mmap (and on free, unmap) every allocation of ``threshold`` bytes or more."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)
    except OSError:
        pass  # not glibc: peaks may then include memory the allocator kept


def flat_allreduce_step(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Average the gradients by hand: pack into ``flat``, one in-place MPI allreduce, unpack."""
    grads = [p.grad.reshape(-1) for p in model.parameters()]
    torch.cat(grads, out=flat)
    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, [flat.numpy(), MPI.FLOAT], op=MPI.SUM)
    flat.div_(MPI.COMM_WORLD.Get_size())
    start = 0
    for g in grads:
        g.copy_(flat[start: start + g.numel()])
        start += g.numel()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", choices=VARIANTS, required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    mmap_large_blocks()
    mpi, gloo = both_engines()
    torch.manual_seed(0)
    model = models.mlp(hidden=args.hidden)
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    mpi.barrier()
    before = psutil.Process().memory_info().rss

    flat = None
    if args.variant == "gpurig-mpi":
        model = gpurig.DataParallel(model, mpi)
    elif args.variant == "gpurig-gloo":
        model = gpurig.DataParallel(model, gloo)
    elif args.variant == "ddp-gloo":
        model = DDP(model)
    elif args.variant == "flat-mpi":
        flat = torch.empty(gradient_bytes // 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(args.steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if flat is not None:
            flat_allreduce_step(model, flat)
        opt.step()

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    growth = mpi.allgather(torch.tensor([float(peak - before)], dtype=torch.float64)).tolist()
    write_result(mpi, args.out, {"variant": args.variant, "steps": args.steps, "hidden": args.hidden,
                                 "parameters": gradient_bytes // 4, "gradient_bytes": gradient_bytes,
                                 "growth_bytes_per_rank": growth})


if __name__ == "__main__":
    main()
