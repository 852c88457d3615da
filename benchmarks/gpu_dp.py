"""DataParallel on CUDA tensors vs DistributedDataParallel, in one job (run on a GPU machine; on_gpu.sh calls it).

    gpurig run -n 2 -- python benchmarks/gpu_dp.py --model cnn --out /tmp/gpu_dp.json

Each rank trains on ``cuda:(local rank % GPUs)`` (two ranks may share one GPU).
Variants, interleaved in blocks as in dp_vs_ddp.py: gpurig over Gloo and DDP
over Gloo (torch.distributed's default group, CUDA tensors), gpurig over Gloo
without its checks, gpurig handing Gloo the CUDA buckets ("on device": not
staging them itself, an experiment), and gpurig over MPI, which stages each
bucket through pinned host memory unless the MPI is CUDA-aware. NCCL is not among them when two ranks share a GPU: NCCL refuses a
group with the same GPU twice. Reported per variant: the median step of the
slowest rank and the throughput ratio to DDP, round by round.
"""

import copy

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gpurig
from gpurig import models
from gpurig.comm import Communicator
from gpurig.comm.torch_engine import TorchEngine
from common import (both_engines, interleave, median, paired_ratio, slowest_rank, step_benchmark_args, training_block,
                    write_result)


def device_tensors_to_gloo() -> TorchEngine:
    """A Gloo engine that hands CUDA buckets to Gloo as they are, as DDP does (Gloo stages them on its own
    streams), instead of gpurig copying them to pinned host memory first: the experiment docs/benchmarks.md's
    "On a lent H100" proposes. Gloo's allreduce, broadcast and allgather take device tensors."""
    engine = TorchEngine(backend="gloo")
    engine.accepts_device_tensors = True
    return engine


def main():
    p = step_benchmark_args(__doc__)
    args = p.parse_args()
    mpi, gloo = both_engines()
    cuda = torch.cuda.is_available()  # without one, the same code on the CPU (a check of the script)
    device = torch.device("cuda", mpi.local_rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    base = models.build(args.model).to(device)
    g = torch.Generator(device=device).manual_seed(1000 + mpi.rank)
    shape = (784,)  # every trainable model takes flat MNIST images
    data = [(torch.randn(args.per_rank_batch, *shape, generator=g, device=device),
             torch.randint(0, 10, (args.per_rank_batch,), generator=g, device=device)) for _ in range(args.block)]
    variants = {"gpurig / gloo": gpurig.DataParallel(copy.deepcopy(base), gloo),
                "DDP / gloo": DDP(copy.deepcopy(base), device_ids=[device.index] if cuda else None),
                "gpurig / gloo, no checks": gpurig.DataParallel(
                    copy.deepcopy(base), Communicator(TorchEngine(backend="gloo"), check=False), nonfinite="ignore"),
                "gpurig / gloo, on device": gpurig.DataParallel(copy.deepcopy(base), Communicator(
                    device_tensors_to_gloo())),
                "gpurig / mpi (staged)": gpurig.DataParallel(copy.deepcopy(base), mpi)}

    def block_of(model):
        steps = training_block(model, data)

        def block():  # a block ends when the GPU has done its work, not when the host has queued it
            steps()
            if cuda:
                torch.cuda.synchronize()
        return block

    seconds = interleave({name: block_of(m) for name, m in variants.items()}, args.rounds, args.warmup)
    slowest = {name: slowest_rank(mpi, s) for name, s in seconds.items()}
    rows = {}
    for name, s in slowest.items():
        step_ms = 1e3 * median(s) / args.block
        rows[name] = {"step_ms": step_ms, "samples_per_s": mpi.size * args.per_rank_batch / step_ms * 1e3,
                      "vs_ddp": paired_ratio(slowest["DDP / gloo"], s)}
    if mpi.rank == 0:
        print(f"{args.model}, {mpi.size} ranks on {torch.cuda.device_count()} GPU(s) ({device.type}), {args.per_rank_batch}/rank")
        for name, r in rows.items():
            print(f"  {name:24s} {r['step_ms']:8.3f} ms  {r['vs_ddp']:.3f}x DDP")
    write_result(mpi, args.out, {"model": args.model, "ranks": mpi.size, "gpus": torch.cuda.device_count(),
                                 "per_rank_batch": args.per_rank_batch, "block": args.block,
                                 "rounds": args.rounds, "variants": rows})


if __name__ == "__main__":
    main()
