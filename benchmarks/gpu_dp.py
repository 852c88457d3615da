"""DataParallel on CUDA tensors vs DistributedDataParallel, in one job (run on a GPU machine; on_gpu.sh calls it).

    gpurig run -n 2 -- python benchmarks/gpu_dp.py --model cnn --out /tmp/gpu_dp.json

Each rank trains on ``cuda:(local rank % GPUs)`` (two ranks may share one GPU).
Variants, interleaved in blocks as in dp_vs_ddp.py: gpurig over Gloo and DDP
over Gloo (torch.distributed's default group, CUDA tensors: Gloo copies them
through pinned memory on its own streams); gpurig over Gloo without its checks,
and without each of them (the collective check, the NaN/Inf guard); gpurig
over Gloo with the guard's flag per parameter (as before 2026-11-27, second); gpurig
over Gloo copying each bucket to pinned host memory itself ("staged", as before
2026-11-27); and gpurig over MPI, which stages each bucket through pinned host
memory unless the MPI is CUDA-aware. NCCL is not among them when two ranks
share a GPU: NCCL refuses a group with the same GPU twice. Reported per
variant: the median step of the slowest rank, the throughput ratio to DDP,
round by round, and how far its weights are from DDP's after the same steps on
the same data (every variant starts from the same weights; cuDNN's
convolutions are not deterministic, so the CNN's drift apart a little).
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


def staged_gloo() -> TorchEngine:
    """A Gloo engine whose every collective takes host tensors only, so the communicator copies each CUDA bucket
    to pinned host memory and back itself: gpurig's Gloo path before 2026-11-27, kept to compare with."""
    engine = TorchEngine(backend="gloo")
    engine.device_collectives = frozenset()
    return engine


class FlaggedPerParameter(gpurig.DataParallel):
    """The NaN/Inf guard as it ran on a GPU before 2026-11-27 (second): a flag per parameter riding in each bucket
    (three more kernels per parameter, a synchronisation per bucket), kept to compare with."""
    flag_devices = ("cpu", "cuda")


def largest_difference(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    """The largest |weight - reference weight| over all parameters, relative to the reference's largest |weight|."""
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    theirs = torch.cat([p.detach().flatten() for p in reference.parameters()])
    return float((mine - theirs).abs().max() / theirs.abs().max())


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
                "gpurig / gloo, staged": gpurig.DataParallel(copy.deepcopy(base), Communicator(staged_gloo())),
                "gpurig / gloo, flag per parameter": FlaggedPerParameter(copy.deepcopy(base), gloo),
                "gpurig / gloo, no collective check": gpurig.DataParallel(
                    copy.deepcopy(base), Communicator(TorchEngine(backend="gloo"), check=False)),
                "gpurig / gloo, no nonfinite guard": gpurig.DataParallel(copy.deepcopy(base), gloo, nonfinite="ignore"),
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
                      "vs_ddp": paired_ratio(slowest["DDP / gloo"], s),
                      "weights_vs_ddp": largest_difference(variants[name], variants["DDP / gloo"])}
    if mpi.rank == 0:
        print(f"{args.model}, {mpi.size} ranks on {torch.cuda.device_count()} GPU(s) ({device.type}), {args.per_rank_batch}/rank")
        for name, r in rows.items():
            print(f"  {name:34s} {r['step_ms']:8.3f} ms  {r['vs_ddp']:.3f}x DDP  weights {r['weights_vs_ddp']:.1e} from DDP's")
    write_result(mpi, args.out, {"model": args.model, "ranks": mpi.size, "gpus": torch.cuda.device_count(),
                                 "per_rank_batch": args.per_rank_batch, "block": args.block,
                                 "rounds": args.rounds, "variants": rows})


if __name__ == "__main__":
    main()
